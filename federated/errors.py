"""Exception types of sporenet.federated; the server maps each to one gRPC status code."""

from __future__ import annotations


class FederatedError(Exception):
    """Base class of every error raised by sporenet.federated."""


class ConfigError(FederatedError, ValueError):
    """A server, client or strategy setting is missing or has a bad value."""


class UpdateRejectedError(FederatedError, ValueError):
    """A client's update is malformed, oversized, non-finite or does not match the model."""


class AuthError(FederatedError):
    """A request is unauthenticated, badly signed, expired or replayed."""


class PermissionDeniedError(FederatedError):
    """An authenticated client asked for something that belongs to another client."""


class UnknownClientError(FederatedError, LookupError):
    """The client id is not registered (e.g. the server's state was wiped): register again."""


class StaleTaskError(FederatedError):
    """The task or round an upload or report refers to is no longer open."""


class HierarchyError(FederatedError):
    """An edge aggregator asked to join a job that cannot be aggregated in tiers (its
    strategy needs every device's update, or its privacy settings assume one tier)."""


class AggregationError(FederatedError):
    """Aggregation could not produce a result (no updates, inconsistent inputs)."""


class TransferError(FederatedError):
    """A chunked download or upload failed its offset, size or checksum checks."""


class ReadTimeoutError(TransferError):
    """A peer sent nothing within `read_timeout` in the middle of an upload: it loses its
    receiving slot (DEADLINE_EXCEEDED) and resumes from what was received."""


class ModelDamagedError(FederatedError):
    """A published model file is missing or its bytes are not the ones its digest names:
    it is never served (DATA_LOSS); the operator restores it from a backup."""


class SupersededError(FederatedError):
    """The client started another upload: its earlier one gives up its receiving slot
    (ABORTED; a client sends one upload at a time)."""


class MalformedMessageError(FederatedError, ValueError):
    """A message is not what its call expects (e.g. an unknown or garbled Session message)."""


QUOTE_LIMIT = 64


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for an error message, cut to `limit` characters when longer.

    Messages quote strings the caller sent (client ids, task ids); a status's details
    travel back in the reply metadata, which a long echo would push past the client's
    limit (the caller would then see RESOURCE_EXHAUSTED instead of the real status).
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(str(value))} characters)"


class JobFailedError(FederatedError):
    """The server's job failed (e.g. a round could not gather enough valid updates):
    `Client.run()` raises it with the server's reason instead of polling forever."""
