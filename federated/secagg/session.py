"""The secure round in the daemon's terms: string client ids, named tensors, opaque bytes.

`SecureRound` is what a round loop holds on the server between "collect" and "publish":
it maps the authenticated client ids of the sampled cohort to protocol indices, relays
opaque message bytes, and turns the secure sum into the mean delta as named tensors.
`SecureClientSession` is the client SDK side: it answers each server message with bytes.
Both sides flatten an update in the template's tensor order, so only the model's
template (names, shapes, dtypes) has to agree. Everything persists as bytes.

The mean is unweighted over the contributors unless the round sets `max_weight`: then
each client clips its update, scales it by w = min(num_samples, max_weight) / max_weight
and appends w·clipping_range as one more masked coordinate, and the server divides the
secure sum of w·x by the secure sum of w (Flower's SecAgg+ does the same). The server
still learns only the two sums; `max_weight` bounds any one client's influence.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sporenet.federated.aggregation import Template, Weights
from sporenet.federated.secagg.client import SecAggClient
from sporenet.federated.secagg.config import SecAggConfig
from sporenet.federated.secagg.errors import (
    ClientExcludedError,
    ProtocolError,
    SecAggConfigError,
)
from sporenet.federated.secagg.messages import (
    AdvertiseKeys,
    ClientMessage,
    KeysBroadcast,
    MaskedInput,
    RoundSetup,
    ShareKeys,
    SharesDelivery,
    UnmaskRequest,
    UnmaskResponse,
)
from sporenet.federated.secagg.server import SecAggServer, Stage

_DECODERS: dict[Stage, Callable[[bytes], ClientMessage]] = {
    Stage.ADVERTISE_KEYS: AdvertiseKeys.from_bytes,
    Stage.SHARE_KEYS: ShareKeys.from_bytes,
    Stage.MASKED_INPUT: MaskedInput.from_bytes,
    Stage.UNMASK: UnmaskResponse.from_bytes,
}
_HEADER = struct.Struct("<4sQ")  # magic, JSON length


def vector_length(template: Template) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) for shape, _ in template.values())


def flatten(update: Mapping[str, np.ndarray], template: Template) -> np.ndarray:
    """One float64 vector of all tensors, in the template's order; checks every shape."""
    parts = []
    for name, (shape, _) in template.items():
        if name not in update:
            raise ProtocolError(f"update lacks tensor {name!r}")
        a = np.asarray(update[name])
        if tuple(a.shape) != tuple(shape):
            raise ProtocolError(f"tensor {name!r}: expected shape {tuple(shape)}, found {a.shape}")
        parts.append(a.reshape(-1).astype(np.float64))
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, template: Template) -> Weights:
    """Inverse of `flatten`, each tensor cast to its template dtype."""
    out: Weights = {}
    at = 0
    for name, (shape, dtype) in template.items():
        size = int(np.prod(shape, dtype=np.int64))
        out[name] = vector[at : at + size].reshape(shape).astype(dtype)
        at += size
    return out


def _template_to_json(template: Template) -> list[list]:
    return [[n, list(s), np.dtype(d).str] for n, (s, d) in template.items()]


def _template_from_json(rows: list[list]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {str(n): (tuple(int(v) for v in s), np.dtype(d)) for n, s, d in rows}


class SecureRound:
    """Server side of one secure round for a cohort of named clients."""

    def __init__(
        self,
        server: SecAggServer,
        client_ids: Sequence[str],
        template: Template,
        *,
        max_weight: float | None = None,
    ) -> None:
        if len(set(client_ids)) != len(client_ids):
            raise ProtocolError("client ids of a secure round must be distinct")
        if len(client_ids) != server.params.num_clients:
            raise ProtocolError(
                f"{len(client_ids)} client ids for a round of {server.params.num_clients} clients"
            )
        _check_max_weight(max_weight)
        if vector_length(template) + (max_weight is not None) != server.vector_length:
            raise ProtocolError("the template does not match the round's vector length")
        self.max_weight = max_weight
        self.server = server
        self.client_ids = list(client_ids)
        self.template = dict(template)
        self._index = {cid: i for i, cid in enumerate(self.client_ids)}

    @classmethod
    def start(
        cls,
        config: SecAggConfig,
        *,
        client_ids: Sequence[str],
        template: Template,
        max_weight: float | None = None,
    ) -> SecureRound:
        """A new round; `max_weight` turns on sample weighting (see the module docstring)."""
        _check_max_weight(max_weight)
        length = vector_length(template) + (max_weight is not None)
        server = SecAggServer.start(config, num_clients=len(client_ids), vector_length=length)
        return cls(server, client_ids, template, max_weight=max_weight)

    @property
    def stage(self) -> Stage:
        return self.server.stage

    def index_of(self, client_id: str) -> int:
        try:
            return self._index[client_id]
        except KeyError:
            raise ProtocolError(f"client {client_id!r} is not in this secure round") from None

    def setup_payload(self, client_id: str) -> bytes:
        """The RoundSetup a sampled client starts from."""
        return self.server.setup_for(self.index_of(client_id)).to_bytes()

    def payload_for(self, client_id: str) -> bytes:
        """The server message the client needs in the current stage (b"" when none)."""
        if self.stage == Stage.ADVERTISE_KEYS:
            return b""
        return self.server.message_for(self.index_of(client_id)).to_bytes()

    def expects(self, client_id: str) -> bool:
        """Whether the server is waiting for this client's message of the current stage."""
        return self.index_of(client_id) in self.server.pending_clients()

    def pending(self) -> list[str]:
        return [self.client_ids[i] for i in sorted(self.server.pending_clients())]

    def submit(self, client_id: str, payload: bytes) -> None:
        """Record one client message; its claimed index must be the sender's own.

        ClientExcludedError (a ProtocolError: INVALID_ARGUMENT to the client) when the
        message gets its sender excluded, e.g. a low-order key; `client` is the client id.
        """
        decoder = _DECODERS.get(self.stage)
        if decoder is None:
            raise ProtocolError(f"the secure round is {self.stage.value}: no message expected")
        message = decoder(payload)
        if message.client != self.index_of(client_id):
            raise ProtocolError(
                f"client {client_id!r} sent a message as client index "
                f"{message.client}, its own is {self.index_of(client_id)}"
            )
        try:
            self.server.receive(message)
        except ClientExcludedError as e:
            raise ClientExcludedError(
                f"client {client_id!r} is excluded from the secure round: {e.reason}",
                client=client_id,
                reason=e.reason,
            ) from None

    def close_stage(self) -> None:
        self.server.close_stage()

    def excluded(self) -> dict[str, str]:
        """Clients excluded for misbehaving so far (client id -> what they sent), in the
        order they were excluded; persisted with the round."""
        return {self.client_ids[i]: why for i, why in self.server.excluded.items()}

    def complaints(self) -> dict[str, list[str]]:
        """Recipient id -> ids of the senders whose relayed shares it could not decrypt
        (reported with its masked input; persisted with the round)."""
        return {
            self.client_ids[u]: [self.client_ids[v] for v in sorted(of)]
            for u, of in sorted(self.server.complaints.items())
        }

    def result(self) -> tuple[Weights, list[str]]:
        """(mean delta over the contributors as named tensors, their client ids)."""
        res = self.server.result()
        ids = [self.client_ids[i] for i in res.contributors]
        if self.max_weight is None:
            return unflatten(res.mean, self.template), ids
        total_weight = res.sum[-1] / self.server.params.clipping_range
        if not total_weight > 0:
            raise ProtocolError(f"the secure sum of the weights is {total_weight}, not positive")
        return unflatten(res.sum[:-1] / total_weight, self.template), ids

    def to_bytes(self) -> bytes:
        meta = json.dumps(
            {
                "client_ids": self.client_ids,
                "template": _template_to_json(self.template),
                "max_weight": self.max_weight,
            }
        ).encode()
        return _HEADER.pack(b"SASR", len(meta)) + meta + self.server.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> SecureRound:
        try:
            magic, n = _HEADER.unpack_from(data)
            if magic != b"SASR":
                raise ProtocolError("not a secure round state")
            meta = json.loads(data[_HEADER.size : _HEADER.size + n])
            server = SecAggServer.from_bytes(data[_HEADER.size + n :])
            return cls(
                server,
                [str(c) for c in meta["client_ids"]],
                _template_from_json(meta["template"]),
                max_weight=meta["max_weight"],
            )
        except (KeyError, TypeError, ValueError, struct.error) as e:
            raise ProtocolError(f"secure round state is corrupt: {e!r}") from None


class SecureClientSession:
    """Client side: answers each stage's server message with the bytes to send back."""

    def __init__(
        self,
        setup_payload: bytes,
        template: Template,
        *,
        max_weight: float | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        _check_max_weight(max_weight)
        setup = RoundSetup.from_bytes(setup_payload)
        length = vector_length(template) + (max_weight is not None)
        if length != setup.vector_length:
            raise ProtocolError(
                f"the local model (weighted: {max_weight is not None}) has {length} values, "
                f"the secure round expects {setup.vector_length}"
            )
        self.max_weight = max_weight
        self.template = dict(template)
        self.client = SecAggClient(setup, rng=rng)
        self._last: tuple[Stage, bytes, bytes] | None = None

    def respond(
        self,
        stage: Stage,
        payload: bytes,
        update: Mapping[str, np.ndarray] | None = None,
        num_samples: int | None = None,
    ) -> bytes:
        """The reply to the server's `payload` for `stage` (the update, and its sample count
        when the round is weighted, only at MASKED_INPUT).

        Asked again for the same stage and payload (the reply was lost, or the server
        restarted before saving it), the session resends its earlier reply byte for byte:
        recomputing would need fresh secrets and could expose a different masked vector.
        """
        if self._last is not None and self._last[0] == stage:
            if self._last[1] != payload:
                raise ProtocolError(f"the server changed its {stage.value} message on a retry")
            return self._last[2]
        reply = self._reply(stage, payload, update, num_samples)
        self._last = (stage, payload, reply)
        return reply

    def _reply(
        self,
        stage: Stage,
        payload: bytes,
        update: Mapping[str, np.ndarray] | None,
        num_samples: int | None,
    ) -> bytes:
        if stage == Stage.ADVERTISE_KEYS:
            return self.client.advertise_keys().to_bytes()
        if stage == Stage.SHARE_KEYS:
            return self.client.share_keys(KeysBroadcast.from_bytes(payload)).to_bytes()
        if stage == Stage.MASKED_INPUT:
            if update is None:
                raise ProtocolError("the masked input stage needs the client's update")
            vector = flatten(update, self.template)
            if self.max_weight is not None:
                vector = self._weighted(vector, num_samples, self.max_weight)
            return self.client.masked_input(SharesDelivery.from_bytes(payload), vector).to_bytes()
        if stage == Stage.UNMASK:
            return self.client.unmask(UnmaskRequest.from_bytes(payload)).to_bytes()
        raise ProtocolError(f"no client step for stage {stage.value}")

    def _weighted(
        self, vector: np.ndarray, num_samples: int | None, max_weight: float
    ) -> np.ndarray:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ProtocolError(f"a weighted round needs num_samples >= 1, found {num_samples!r}")
        c = self.client.params.clipping_range
        w = min(num_samples, max_weight) / max_weight
        # Clip before scaling, so |w·x| <= c and the ring never clips a weighted value.
        return np.concatenate([np.clip(vector, -c, c) * w, [w * c]])


def _check_max_weight(max_weight: float | None) -> None:
    if max_weight is None:
        return
    if (
        isinstance(max_weight, bool)
        or not isinstance(max_weight, int | float)
        or not np.isfinite(max_weight)
        or max_weight <= 0
    ):
        raise SecAggConfigError(
            f"`max_weight` must be a finite number > 0 or None, found {max_weight!r}"
        )
