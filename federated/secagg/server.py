"""The server side of one secure round as a persisted state machine.

Stages: ADVERTISE_KEYS -> SHARE_KEYS -> MASKED_INPUT -> UNMASK -> COMPLETED (or FAILED).
In each stage the server collects one message per active client (`receive`), and the
round loop decides when to `close_stage` (all answered or a deadline passed). Everything
sent to a client (`message_for`) is a pure function of the state, and the state
round-trips through `to_bytes`/`from_bytes`, so a restarted server resumes mid-stage.

The masked inputs are folded into one running ring sum as they arrive: server memory
does not grow with the number of clients (beyond the n·k small relayed ciphertexts, held
from SHARE_KEYS until MASKED_INPUT closes: ~5 MB at n = 1000, k = 30).

Persisting: save `to_bytes()` at every stage transition (required: a transition must
not be lost) and every so many messages within a stage. Messages received after the last
save are simply asked for again after a restart, and clients (see session.py) resend
byte-identical replies, so a masked vector is never folded twice or recomputed.

Fewer than `threshold` survivors anywhere that matters fails the round with
ThresholdError; the server never outputs a wrong sum.

Malicious clients (see docs/threat_model.md): a client that advertises a low-order X25519
key is excluded at once (ClientExcludedError; to its peers it is a dropout before
sharing, so no honest client ever uses its key). At unmask every secret is decoded from
all the shares that arrived (decoding.py): up to (s - t) // 2 bad shares among s are
located and left out, and their senders are excluded instead of failing the round.
`excluded` (and the result's) names every excluded client with the reason. A client
whose relayed shares a peer could not decrypt is not excluded on that peer's word alone
(the server cannot tell which of the two lies): the peer holds none of its shares, which
counts against the threshold like a dropped holder, and `complaints` records who
reported whom.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from sporenet.federated.secagg import crypto, decoding, shamir
from sporenet.federated.secagg.client import mask_sign, self_mask_digest
from sporenet.federated.secagg.config import RoundParams, SecAggConfig
from sporenet.federated.secagg.encoding import FixedPointCodec
from sporenet.federated.secagg.errors import (
    ClientExcludedError,
    InvalidKeyError,
    ProtocolError,
    ReconstructionError,
    SecAggError,
    ThresholdError,
)
from sporenet.federated.secagg.graph import neighbour_graph
from sporenet.federated.secagg.messages import (
    AdvertiseKeys,
    ClientMessage,
    KeysBroadcast,
    MaskedInput,
    RoundSetup,
    ServerMessage,
    ShareKeys,
    SharesDelivery,
    UnmaskRequest,
    UnmaskResponse,
    b64,
    unb64,
)
from sporenet.federated.secagg.prg import add_mask, ring_dtype


class Stage(StrEnum):
    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    UNMASK = "unmask"
    COMPLETED = "completed"
    FAILED = "failed"


_EXPECTED: dict[Stage, type] = {
    Stage.ADVERTISE_KEYS: AdvertiseKeys,
    Stage.SHARE_KEYS: ShareKeys,
    Stage.MASKED_INPUT: MaskedInput,
    Stage.UNMASK: UnmaskResponse,
}


@dataclass(frozen=True)
class SecAggResult:
    """The decoded sum of the surviving clients' clipped updates, and who they were."""

    sum: np.ndarray
    contributors: tuple[int, ...]
    #: Per-coordinate bound on |sum - sum of clipped updates| from fixed-point rounding.
    error_bound: float
    #: Clients excluded for misbehaving (index -> what they sent). One excluded at
    #: advertise contributed nothing; one excluded at unmask for bad shares had already
    #: uploaded its masked input, which stays in the sum and in `contributors` (removing
    #: it would need both of its secrets, which honest clients never reveal together).
    excluded: dict[int, str] = field(default_factory=dict)
    #: Coordinates whose unmasked sum lay outside what the contributors' clipped inputs
    #: can add up to (proof of an unclipped input) and were clamped to that bound.
    out_of_range: int = 0

    @property
    def mean(self) -> np.ndarray:
        return self.sum / len(self.contributors)


_STATE_MAGIC = b"SASV"
_STATE_HEADER = struct.Struct("<4sIQ")  # magic, format version, JSON length
_STATE_VERSION = 1


class SecAggServer:
    """One secure aggregation round, server side (see the module docstring)."""

    def __init__(
        self,
        params: RoundParams,
        *,
        vector_length: int,
        round_id: bytes | None = None,
        graph_seed: bytes | None = None,
    ) -> None:
        if not isinstance(vector_length, int) or vector_length < 1:
            raise ProtocolError(f"`vector_length` must be an int >= 1, found {vector_length!r}")
        self.params = params
        self.vector_length = vector_length
        self.round_id = round_id if round_id is not None else os.urandom(16)
        self.graph_seed = graph_seed if graph_seed is not None else os.urandom(32)
        self.neighbours = [
            frozenset(row)
            for row in neighbour_graph(params.num_clients, params.num_neighbours, self.graph_seed)
        ]
        self._codec = FixedPointCodec(params)
        self.stage = Stage.ADVERTISE_KEYS
        self.failure = ""
        # Per-stage survivor sets U1 ⊇ U2 ⊇ U3 ⊇ U4 (closed stages only).
        self.survivors: dict[Stage, frozenset[int]] = {}
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._ciphertexts: dict[int, dict[int, bytes]] = {}
        self._digests: dict[int, bytes] = {}
        self._uploaded: list[int] = []
        self._sum: np.ndarray | None = None
        self._key_shares: dict[int, dict[int, bytes]] = {}
        self._self_mask_shares: dict[int, dict[int, bytes]] = {}
        self._responded: list[int] = []
        self._result: np.ndarray | None = None
        self._out_of_range = 0
        #: Clients excluded for misbehaving, with the reason (persisted).
        self.excluded: dict[int, str] = {}
        #: recipient -> the senders whose shares it could not decrypt (it holds none).
        self.complaints: dict[int, frozenset[int]] = {}

    @classmethod
    def start(cls, config: SecAggConfig, *, num_clients: int, vector_length: int) -> SecAggServer:
        """A fresh round for `num_clients` sampled clients with the operator's config."""
        return cls(config.resolve(num_clients), vector_length=vector_length)

    # ---- what the round loop asks -------------------------------------------------------

    def setup_for(self, client: int) -> RoundSetup:
        self._check_index(client)
        return RoundSetup(self.round_id, self.graph_seed, self.params, self.vector_length, client)

    def active_clients(self) -> frozenset[int]:
        """Clients expected to send a message in the current stage."""
        previous = {
            Stage.ADVERTISE_KEYS: None,
            Stage.SHARE_KEYS: Stage.ADVERTISE_KEYS,
            Stage.MASKED_INPUT: Stage.SHARE_KEYS,
            Stage.UNMASK: Stage.MASKED_INPUT,
        }
        if self.stage not in previous:
            return frozenset()
        before = previous[self.stage]
        if before is None:
            return frozenset(range(self.params.num_clients)) - frozenset(self.excluded)
        return self.survivors[before]

    def pending_clients(self) -> frozenset[int]:
        """Active clients that have not sent their message of the current stage yet."""
        return self.active_clients() - self._received()

    def _received(self) -> set[int]:
        return {
            Stage.ADVERTISE_KEYS: set(self._keys),
            Stage.SHARE_KEYS: set(self._ciphertexts),
            Stage.MASKED_INPUT: set(self._uploaded),
            Stage.UNMASK: set(self._responded),
        }.get(self.stage, set())

    def _running_sum(self) -> np.ndarray:
        """The masked sum, allocated when the share-keys stage closed."""
        if self._sum is None:
            raise ProtocolError(f"no masked sum exists yet in stage {self.stage.value}")
        return self._sum

    def message_for(self, client: int) -> ServerMessage:
        """What `client` needs for the current stage (recomputable after a restart)."""
        if client not in self.active_clients() or self.stage == Stage.ADVERTISE_KEYS:
            raise ProtocolError(f"client {client} has no message in stage {self.stage.value}")
        mine = self.neighbours[client]
        if self.stage == Stage.SHARE_KEYS:
            u1 = self.survivors[Stage.ADVERTISE_KEYS]
            return KeysBroadcast({v: self._keys[v] for v in sorted(mine & u1)})
        if self.stage == Stage.MASKED_INPUT:
            u2 = self.survivors[Stage.SHARE_KEYS]
            return SharesDelivery({v: self._ciphertexts[v][client] for v in sorted(mine & u2)})
        u2, u3 = self.survivors[Stage.SHARE_KEYS], self.survivors[Stage.MASKED_INPUT]
        return UnmaskRequest(tuple(sorted(mine & (u2 - u3))), tuple(sorted(mine & u3)))

    # ---- collecting ---------------------------------------------------------------------

    def receive(self, message: ClientMessage) -> None:
        """Validate and record one client message of the current stage."""
        self._check_sender(message)
        if isinstance(message, AdvertiseKeys):
            self._receive_keys(message)
        elif isinstance(message, ShareKeys):
            self._receive_shares(message)
        elif isinstance(message, MaskedInput):
            self._receive_masked_input(message)
        else:
            self._receive_unmask(message)

    def _check_sender(self, message: ClientMessage) -> None:
        """The message belongs to this stage and comes from an active client, once."""
        expected = _EXPECTED.get(self.stage)
        if expected is None or not isinstance(message, expected):
            raise ProtocolError(
                f"stage {self.stage.value} does not accept {type(message).__name__}"
            )
        u = message.client
        if u in self.excluded:
            raise ClientExcludedError(
                f"client {u} was excluded from the round: {self.excluded[u]}",
                client=u,
                reason=self.excluded[u],
            )
        if u not in self.active_clients():
            raise ProtocolError(f"client {u} is not active in stage {self.stage.value}")
        if u in self._received():
            raise ProtocolError(f"client {u} already sent its {type(message).__name__}")

    def _receive_keys(self, message: AdvertiseKeys) -> None:
        u = message.client
        for name, key in (
            ("enc_public", message.enc_public),
            ("mask_public", message.mask_public),
        ):
            if len(key) != crypto.KEY_BYTES:
                raise ProtocolError(
                    f"client {u}: {name} must be {crypto.KEY_BYTES} bytes, found {len(key)}"
                )
            try:
                crypto.check_public(key, f"its {name} key")
            except InvalidKeyError as e:
                # Honest peers would encrypt shares and derive masks under an all-zero
                # secret: leave the client out before anyone sees its keys.
                self.excluded[u] = f"advertised an invalid key: {e}"
                raise ClientExcludedError(
                    f"client {u} is excluded from the round: {e}",
                    client=u,
                    reason=self.excluded[u],
                ) from None
        self._keys[u] = (message.enc_public, message.mask_public)

    def _receive_shares(self, message: ShareKeys) -> None:
        u = message.client
        expected_to = self.neighbours[u] & self.survivors[Stage.ADVERTISE_KEYS]
        if set(message.ciphertexts) != expected_to:
            raise ProtocolError(
                f"client {u} sent shares to {sorted(message.ciphertexts)}, "
                f"expected exactly {sorted(expected_to)}"
            )
        if len(message.self_mask_digest) != 32:
            raise ProtocolError(f"client {u}: self_mask_digest must be 32 bytes")
        self._ciphertexts[u] = dict(message.ciphertexts)
        self._digests[u] = message.self_mask_digest

    def _receive_masked_input(self, message: MaskedInput) -> None:
        u, v = message.client, message.vector
        if v.dtype != ring_dtype(self.params.modulus_bits) or v.size != self.vector_length:
            raise ProtocolError(
                f"client {u}: masked input must be {self.vector_length} x "
                f"{ring_dtype(self.params.modulus_bits)}, found {v.size} x {v.dtype}"
            )
        delivered = self.neighbours[u] & self.survivors[Stage.SHARE_KEYS]
        refused = set(message.refused)
        if not refused <= delivered or len(refused) != len(message.refused):
            raise ProtocolError(
                f"client {u} refused shares of clients {sorted(message.refused)}, but was "
                f"sent shares by {sorted(delivered)} only"
            )
        total = self._running_sum()
        np.add(total, v, out=total)
        self._uploaded.append(u)
        if refused:
            self.complaints[u] = frozenset(refused)

    def _receive_unmask(self, message: UnmaskResponse) -> None:
        u = message.client
        want = self.message_for(u)
        if not isinstance(want, UnmaskRequest):
            raise ProtocolError(
                f"client {u}: an unmask response in stage {self.stage.value}, which asks "
                f"for {type(want).__name__}"
            )
        lacking = self.complaints.get(u, frozenset())
        if (
            set(message.key_shares) != set(want.dropped) - lacking
            or set(message.self_mask_shares) != set(want.survivors) - lacking
        ):
            raise ProtocolError(f"client {u}'s unmask response does not answer its request")
        for owner, data in message.key_shares.items():
            shamir.share_from_bytes(data)
            self._key_shares.setdefault(owner, {})[u] = data
        for owner, data in message.self_mask_shares.items():
            shamir.share_from_bytes(data)
            self._self_mask_shares.setdefault(owner, {})[u] = data
        self._responded.append(u)

    # ---- stage transitions --------------------------------------------------------------

    def close_stage(self) -> None:
        """End the current stage with whoever answered; ThresholdError fails the round."""
        if self.stage not in _EXPECTED:
            raise ProtocolError(f"stage {self.stage.value} cannot be closed")
        try:
            if self.stage == Stage.ADVERTISE_KEYS:
                self._close_pruned(set(self._keys), Stage.SHARE_KEYS)
            elif self.stage == Stage.SHARE_KEYS:
                self._close_pruned(set(self._ciphertexts), Stage.MASKED_INPUT)
                self._sum = np.zeros(self.vector_length, ring_dtype(self.params.modulus_bits))
            elif self.stage == Stage.MASKED_INPUT:
                self._close_masked_input()
            else:
                self._close_unmask()
        except SecAggError as e:
            self.stage = Stage.FAILED
            self.failure = str(e)
            raise

    def _close_pruned(self, alive: set[int], next_stage: Stage) -> None:
        # A client whose shares fewer than t live neighbours hold could never be unmasked
        # if it dropped later: leave it out, which may starve its neighbours in turn.
        t = self.params.threshold
        changed = True
        while changed:
            starving = {u for u in alive if len(self.neighbours[u] & alive) < t}
            alive -= starving
            changed = bool(starving)
        if len(alive) < t:
            raise ThresholdError(
                f"stage {self.stage.value}: {len(alive)} clients can continue, threshold is {t}"
            )
        self.survivors[self.stage] = frozenset(alive)
        self.stage = next_stage

    def _close_masked_input(self) -> None:
        t = self.params.threshold
        u2, u3 = self.survivors[Stage.SHARE_KEYS], frozenset(self._uploaded)
        if len(u3) < t:
            raise ThresholdError(
                f"stage masked_input: {len(u3)} clients uploaded, threshold is {t}"
            )
        for u in sorted(u2):
            holders = {v for v in self.neighbours[u] & u3 if u not in self.complaints.get(v, ())}
            needs = u in u3 or bool(self.neighbours[u] & u3)
            if needs and len(holders) < t:
                what = "self-mask seed" if u in u3 else "mask key"
                accusers = sorted(v for v, of in self.complaints.items() if u in of)
                why = (
                    f" (clients {accusers} could not decrypt the shares it sent them)"
                    if accusers
                    else ""
                )
                raise ThresholdError(
                    f"stage masked_input: client {u}'s {what} has {len(holders)} "
                    f"surviving share holders{why}, threshold is {t}"
                )
        self.survivors[Stage.MASKED_INPUT] = u3
        self.stage = Stage.UNMASK
        # Every delivery has been made: the relayed ciphertexts (most of the state's bytes,
        # n·k of them) are never needed again.
        self._ciphertexts = {}

    def _close_unmask(self) -> None:
        t = self.params.threshold
        u2, u3 = self.survivors[Stage.SHARE_KEYS], self.survivors[Stage.MASKED_INPUT]
        self.survivors[Stage.UNMASK] = frozenset(self._responded)
        wanted: list[tuple[int, str, dict[int, bytes]]] = []
        for u in sorted(u3):
            wanted.append((u, "self", self._self_mask_shares.get(u, {})))
        for u in sorted(u2 - u3):
            if self.neighbours[u] & u3:
                wanted.append((u, "key", self._key_shares.get(u, {})))
        for u, what, shares in wanted:
            if len(shares) < t:
                raise ThresholdError(
                    f"stage unmask: {len(shares)} shares of client {u}'s {_SECRET_NAME[what]} "
                    f"arrived, threshold is {t}"
                )
        secrets, flagged = self._decode_secrets(wanted)
        total = self._running_sum().copy()
        for (u, what, shares), secret in zip(wanted, secrets, strict=True):
            value = secret.tobytes()
            if what == "self":
                if self_mask_digest(self.round_id, u, value) != self._digests[u]:
                    raise ReconstructionError(
                        f"client {u}'s self-mask seed does not match its commitment: "
                        + _uncorrectable(len(shares), t)
                    )
                add_mask(total, value, -1)
                continue
            key = crypto.load_private(value)
            if crypto.public_bytes(key) != self._keys[u][1]:
                raise ReconstructionError(
                    f"client {u}'s reconstructed mask key does not match its advertised "
                    "public key: " + _uncorrectable(len(shares), t)
                )
            for v in sorted(self.neighbours[u] & u3):
                seed = crypto.agree(
                    key,
                    self._keys[v][1],
                    purpose=crypto.PURPOSE_MASK,
                    round_id=self.round_id,
                    a=u,
                    b=v,
                )
                add_mask(total, seed, -mask_sign(v, u))  # undo what v added for the pair (v, u)
        # Every secret matched its commitment: the located bad shares were bad.
        for holder, reason in flagged.items():
            self.excluded.setdefault(holder, reason)
        self._result, self._out_of_range = self._codec.decode_bounded_sum(total, len(u3))
        self.stage = Stage.COMPLETED

    def _decode_secrets(
        self, wanted: list[tuple[int, str, dict[int, bytes]]]
    ) -> tuple[np.ndarray, dict[int, str]]:
        """Decode every wanted secret from all its shares; (secrets, holder -> reason) for
        the holders whose shares were located as bad. Raises if a secret cannot be decoded.
        """
        t = self.params.threshold
        secrets = np.zeros((len(wanted), 32), np.uint8)
        flagged: dict[int, str] = {}
        by_count: dict[int, list[int]] = {}
        for row, (_, _, shares) in enumerate(wanted):
            by_count.setdefault(len(shares), []).append(row)
        for count, rows in sorted(by_count.items()):
            holders = [sorted(wanted[r][2]) for r in rows]
            xs = np.array(holders, np.int64) + 1
            # Every share's length was checked on receipt: parse the group in one go.
            raw = b"".join(wanted[r][2][h] for r, hs in zip(rows, holders, strict=True) for h in hs)
            ys = np.frombuffer(raw, "<u4").astype(np.int64).reshape(len(rows), count, -1)
            found = decoding.decode(xs, ys, t)
            for i, r in enumerate(rows):
                u, what, _ = wanted[r]
                if not found.ok[i]:
                    raise ReconstructionError(
                        f"the {count} shares of client {u}'s {_SECRET_NAME[what]} are "
                        "inconsistent: " + _uncorrectable(count, t)
                    )
                secrets[r] = found.secrets[i]
                for j in np.flatnonzero(found.bad[i]):
                    flagged.setdefault(
                        holders[i][j],
                        f"sent a share of client {u}'s {_SECRET_NAME[what]} that disagrees "
                        f"with the other {count - int(found.bad[i].sum())} holders' shares",
                    )
        return secrets, flagged

    def result(self) -> SecAggResult:
        """The aggregate after a completed round (ThresholdError if the round failed)."""
        if self.stage == Stage.FAILED:
            raise ThresholdError(f"the secure round failed: {self.failure}")
        if self.stage != Stage.COMPLETED or self._result is None:
            raise ProtocolError(f"the secure round is still in stage {self.stage.value}")
        contributors = tuple(sorted(self.survivors[Stage.MASKED_INPUT]))
        return SecAggResult(
            self._result.copy(),
            contributors,
            self._codec.sum_error_bound(len(contributors)),
            dict(self.excluded),
            self._out_of_range,
        )

    def _check_index(self, client: int) -> None:
        if not isinstance(client, int) or not 0 <= client < self.params.num_clients:
            raise ProtocolError(
                f"client index must be in [0, {self.params.num_clients}), found {client!r}"
            )

    # ---- persistence --------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The whole state: a JSON document plus the raw running sum (no pickle)."""
        doc: dict[str, Any] = {
            "params": self.params.to_dict(),
            "vector_length": self.vector_length,
            "round_id": b64(self.round_id),
            "graph_seed": b64(self.graph_seed),
            "stage": self.stage.value,
            "failure": self.failure,
            "survivors": {s.value: sorted(v) for s, v in self.survivors.items()},
            "keys": {str(u): [b64(e), b64(m)] for u, (e, m) in self._keys.items()},
            "ciphertexts": {
                str(u): {str(v): b64(c) for v, c in cts.items()}
                for u, cts in self._ciphertexts.items()
            },
            "digests": {str(u): b64(d) for u, d in self._digests.items()},
            "uploaded": self._uploaded,
            "responded": self._responded,
            "key_shares": _nested_b64(self._key_shares),
            "self_mask_shares": _nested_b64(self._self_mask_shares),
            "excluded": {str(u): why for u, why in self.excluded.items()},
            "out_of_range": self._out_of_range,
            "complaints": {str(u): sorted(v) for u, v in self.complaints.items()},
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        raw = b""
        if self._sum is not None:
            raw = self._sum.astype(self._sum.dtype.newbyteorder("<"), copy=False).tobytes()
        if self._result is not None:
            raw += self._result.astype("<f8", copy=False).tobytes()
        return _STATE_HEADER.pack(_STATE_MAGIC, _STATE_VERSION, len(body)) + body + raw

    @classmethod
    def from_bytes(cls, data: bytes) -> SecAggServer:
        """Rebuild a server from `to_bytes` output; ProtocolError on anything inconsistent."""
        try:
            magic, version, n = _STATE_HEADER.unpack_from(data)
            if magic != _STATE_MAGIC or version != _STATE_VERSION:
                raise ProtocolError(f"not a secure aggregation state (version {version})")
            doc = json.loads(data[_STATE_HEADER.size : _STATE_HEADER.size + n])
            raw = memoryview(data)[_STATE_HEADER.size + n :]
            server = cls(
                RoundParams.from_dict(doc["params"]),
                vector_length=doc["vector_length"],
                round_id=unb64(doc["round_id"], "round_id"),
                graph_seed=unb64(doc["graph_seed"], "graph_seed"),
            )
            server.stage = Stage(doc["stage"])
            server.failure = doc["failure"]
            server.survivors = {Stage(s): frozenset(v) for s, v in doc["survivors"].items()}
            server._keys = {
                int(u): (unb64(e, "key"), unb64(m, "key")) for u, (e, m) in doc["keys"].items()
            }
            server._ciphertexts = {
                int(u): {int(v): unb64(c, "ciphertext") for v, c in cts.items()}
                for u, cts in doc["ciphertexts"].items()
            }
            server._digests = {int(u): unb64(d, "digest") for u, d in doc["digests"].items()}
            server._uploaded = [int(u) for u in doc["uploaded"]]
            server._responded = [int(u) for u in doc["responded"]]
            server._key_shares = _nested_unb64(doc["key_shares"])
            server._self_mask_shares = _nested_unb64(doc["self_mask_shares"])
            server.excluded = {int(u): str(why) for u, why in doc.get("excluded", {}).items()}
            server._out_of_range = int(doc.get("out_of_range", 0))
            server.complaints = {
                int(u): frozenset(int(v) for v in vs) for u, vs in doc.get("complaints", {}).items()
            }
            dtype = ring_dtype(server.params.modulus_bits).newbyteorder("<")
            ring_bytes = dtype.itemsize * server.vector_length
            if server.stage in (Stage.MASKED_INPUT, Stage.UNMASK, Stage.COMPLETED) or (
                server.stage == Stage.FAILED and len(raw) >= ring_bytes
            ):
                if len(raw) < ring_bytes:
                    raise ProtocolError("secure aggregation state is missing its running sum")
                server._sum = np.frombuffer(raw[:ring_bytes], dtype).astype(dtype.newbyteorder("="))
                raw = raw[ring_bytes:]
            if server.stage == Stage.COMPLETED:
                if len(raw) != 8 * server.vector_length:
                    raise ProtocolError("secure aggregation state is missing its result")
                server._result = np.frombuffer(raw, "<f8").astype(np.float64)
        except (KeyError, TypeError, ValueError, struct.error) as e:
            raise ProtocolError(f"secure aggregation state is corrupt: {e!r}") from None
        return server


_SECRET_NAME = {"self": "self-mask seed", "key": "mask key"}


def _uncorrectable(shares: int, threshold: int) -> str:
    """Why `shares` shares of a threshold-`threshold` secret could not be corrected."""
    e = decoding.correctable(shares, threshold)
    if shares == threshold:
        return (
            f"exactly t = {threshold} shares arrived, which cannot locate a bad share "
            f"(t + 2 = {threshold + 2} shares correct one)"
        )
    return (
        f"{shares} shares with threshold t = {threshold} correct at most {e} bad "
        f"share{'s' if e != 1 else ''} (correcting e bad shares needs t + 2e shares), "
        "so more than that were bad"
    )


def _nested_b64(d: dict[int, dict[int, bytes]]) -> dict[str, dict[str, str]]:
    return {str(a): {str(b): b64(v) for b, v in inner.items()} for a, inner in d.items()}


def _nested_unb64(d: dict[str, dict[str, str]]) -> dict[int, dict[int, bytes]]:
    return {int(a): {int(b): unb64(v, "share") for b, v in inner.items()} for a, inner in d.items()}
