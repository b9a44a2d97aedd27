"""Exception types of the secure aggregation protocol (sporenet.federated.secagg)."""

from __future__ import annotations

from sporenet.federated.errors import ConfigError, FederatedError


class SecAggError(FederatedError):
    """Base class of every error raised by the secure aggregation protocol."""


class SecAggConfigError(SecAggError, ConfigError):
    """A secure aggregation setting is out of range or inconsistent with the round size."""


class ProtocolError(SecAggError):
    """A message arrived in the wrong stage, twice, from an unknown client or malformed."""


class InvalidKeyError(ProtocolError):
    """A public key that is not a usable X25519 key (wrong length or a low-order point)."""


class ClientExcludedError(ProtocolError):
    """The server excluded a client for a message an honest client never sends.

    `client` names it (a protocol index in SecAggServer, the client id in SecureRound) and
    `reason` says what it sent; the client takes no further part in the round.
    """

    def __init__(self, message: str, *, client: int | str, reason: str) -> None:
        super().__init__(message)
        self.client = client
        self.reason = reason


class ThresholdError(SecAggError):
    """Fewer clients than the reconstruction threshold survived a stage: the round fails."""


class ReconstructionError(SecAggError):
    """Shamir reconstruction failed or produced a secret that does not match its commitment."""


class DecryptionError(SecAggError):
    """A relayed share ciphertext failed authentication (tampered, misrouted or wrong key)."""


class UnmaskRefusedError(SecAggError):
    """An honest client refused an unmask request that would expose a peer's input."""
