"""One secure buffer of an async job: a SecAgg+ instance among the devices that fill it.

In a secure async job a device trains on the version it downloaded and, when done, says
it is ready (its update stays on the device). The first `size` ready devices form the
buffer's cohort: only then is the SecAgg+ round (secagg/session.py) started among them,
so a device selected early but slow to train never holds a buffer open. Each member is
told its staleness weight `s(tau)`, `tau` = versions published since the one it trained
on (the server knows each device's version), and scales its update by it before masking;
the unmasked sample-weighted mean is then the plain buffer's `sum n_i s_i u_i / sum n_i`
within the fixed-point error. Members that drop out after the share-keys stage are
recovered as in rounds, from `threshold` of the buffer's members.

Like secure_phase.py, which it composes for the stages, it does no I/O and reads no
clock: the caller passes the time, persists `to_bytes()` at every transition and maps
the StaleTaskError it raises to a status code.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from sporenet.federated.aggregation import Template, Weights
from sporenet.federated.errors import AggregationError, StaleTaskError, quote
from sporenet.federated.secagg import SecAggConfig, SecAggError
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.strategies.staleness import Staleness

_HEADER = struct.Struct("<4sI")


@dataclass(frozen=True)
class Member:
    """A ready device: the version it trained on, its staleness then, and its weight."""

    version: int
    tau: int
    weight: float


class SecureBuffer:
    """The ready devices of one secure buffer and, once `size` are in, its secure round."""

    def __init__(
        self,
        size: int,
        max_staleness: int,
        staleness: Staleness,
        members: dict[str, Member] | None = None,
        secure: SecurePhase | None = None,
    ) -> None:
        if size < 2:
            raise AggregationError(f"a secure buffer needs at least 2 members, found {size}")
        self.size = size
        self._max_staleness = max_staleness
        self._staleness = staleness
        # Insertion order is arrival order: the first `size` ready form the cohort.
        self.members: dict[str, Member] = dict(members or {})
        self.secure = secure

    @property
    def full(self) -> bool:
        return len(self.members) >= self.size

    def ready(self, client_id: str, version: int, current_version: int) -> Member:
        """Record that `client_id` finished training on `version` (the job is at
        `current_version`); the Member says the weight it is to scale its update by.

        Raises:
            StaleTaskError: the buffer is already full (the device joins the next one),
                the device is already a member, or its version is older than
                `max_staleness` allows.
        """
        if client_id in self.members:
            raise StaleTaskError(f"client {quote(client_id)} is already in this secure buffer")
        if self.full or self.secure is not None:
            raise StaleTaskError(
                f"the secure buffer has its {self.size} members; "
                f"client {quote(client_id)} joins the next one"
            )
        tau = current_version - version
        if not 0 <= tau <= self._max_staleness:
            raise StaleTaskError(
                f"client {quote(client_id)} trained on version {version}, {tau} versions old "
                f"at version {current_version}: outside 0..max_staleness={self._max_staleness}"
            )
        member = Member(version, tau, float(self._staleness.weight(tau)))
        self.members[client_id] = member
        return member

    def leave(self, client_id: str) -> None:
        """A ready device went silent before the cohort formed: its place is free again."""
        if self.secure is None:
            self.members.pop(client_id, None)

    def form(
        self,
        config: SecAggConfig,
        template: Template,
        *,
        max_weight: float | None,
        deadline: float,
    ) -> SecurePhase:
        """Start the secure round among the members (the buffer must be full).

        Raises:
            AggregationError: not full, formed already, or SecAgg+ cannot start.
        """
        if self.secure is not None:
            raise AggregationError("the secure buffer's round is formed already")
        if not self.full:
            raise AggregationError(
                f"the secure buffer has {len(self.members)} of its {self.size} members"
            )
        cohort = list(self.members)[: self.size]
        self.secure = SecurePhase.start(
            config, cohort, template, max_weight=max_weight, deadline=deadline
        )
        return self.secure

    def weight_of(self, client_id: str) -> float:
        """The staleness weight the member scales its update by before masking.

        Raises:
            StaleTaskError: the client is not a member.
        """
        member = self.members.get(client_id)
        if member is None:
            raise StaleTaskError(f"client {quote(client_id)} is not in this secure buffer")
        return member.weight

    def result(self) -> tuple[Weights, list[str]]:
        """The unmasked mean of the contributors' weighted updates, and their ids."""
        if self.secure is None:
            raise AggregationError("the secure buffer's round was never formed")
        return self.secure.round.result()

    def mean_staleness(self, contributors: list[str]) -> float:
        """What the rounds table shows for the buffer (over its contributors)."""
        taus = [self.members[c].tau for c in contributors if c in self.members]
        return sum(taus) / len(taus) if taus else 0.0

    def to_bytes(self) -> bytes:
        meta = json.dumps(
            {
                "size": self.size,
                "members": {c: [m.version, m.tau, m.weight] for c, m in self.members.items()},
                "deadline": self.secure.deadline if self.secure is not None else 0.0,
            }
        ).encode()
        body = self.secure.round.to_bytes() if self.secure is not None else b""
        return _HEADER.pack(b"SABF", len(meta)) + meta + body

    @classmethod
    def from_bytes(cls, data: bytes, max_staleness: int, staleness: Staleness) -> SecureBuffer:
        """A buffer saved by `to_bytes` (weights are kept as the members were told them).

        Raises:
            AggregationError: the saved state is corrupt.
        """
        try:
            magic, n = _HEADER.unpack_from(data)
            if magic != b"SABF":
                raise AggregationError("not a secure buffer state")
            meta = json.loads(data[_HEADER.size : _HEADER.size + n])
            members = {
                str(c): Member(int(v), int(t), float(w)) for c, (v, t, w) in meta["members"].items()
            }
            body = data[_HEADER.size + n :]
            secure = None
            if body:
                secure = SecurePhase(SecureRound.from_bytes(body), deadline=meta["deadline"])
            return cls(int(meta["size"]), max_staleness, staleness, members, secure)
        except (KeyError, TypeError, ValueError, struct.error, SecAggError) as e:
            raise AggregationError(f"secure buffer state is corrupt: {e!r}") from None


def saved_stage(data: bytes) -> str:
    """The stage of a saved secure state, a buffer's or a round's (for `status`, which
    reads the store without the job's settings).

    Raises:
        SecAggError: the round's state is corrupt.
    """
    if data[:4] == b"SABF":
        _, n = _HEADER.unpack_from(data)
        body = data[_HEADER.size + n :]
        return SecureRound.from_bytes(body).stage.value if body else "forming"
    return SecureRound.from_bytes(data).stage.value
