"""In-process driver: one full secure round for n clients with dropouts at each stage.

Every message goes through its wire form (to_bytes/from_bytes), so byte counts are real,
and the server can be rebuilt from its persisted bytes between stages or mid-stage to
exercise a restart. Used by the tests and benchmarks/secure_aggregation.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

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
from sporenet.federated.secagg.server import SecAggResult, SecAggServer, Stage

_T = TypeVar("_T")
STAGES = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)


@dataclass(frozen=True, kw_only=True)
class DropoutPlan:
    """Clients that go silent at a stage (they never send that stage's message or later)."""

    at_stage: dict[Stage, frozenset[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = set(self.at_stage) - set(STAGES)
        if bad:
            raise SecAggConfigError(
                f"dropouts can happen at stages {[s.value for s in STAGES]}, "
                f"found {sorted(s.value for s in bad)}"
            )

    @classmethod
    def random(cls, num_clients: int, rates: dict[Stage, float], seed: int = 0) -> DropoutPlan:
        """Drop round(rate·n) distinct clients at each stage, drawn with a fixed seed."""
        rng = np.random.default_rng(seed)
        remaining = np.arange(num_clients)
        at: dict[Stage, frozenset[int]] = {}
        for stage in STAGES:
            count = round(rates.get(stage, 0.0) * num_clients)
            if not 0 <= count <= remaining.size:
                raise SecAggConfigError(f"dropout rate at {stage.value} must be in [0, 1]")
            picked = rng.choice(remaining, size=count, replace=False)
            at[stage] = frozenset(int(c) for c in picked)
            remaining = np.setdiff1d(remaining, picked)
        return cls(at_stage=at)

    def silent(self, stage: Stage) -> frozenset[int]:
        """Everyone who dropped at `stage` or earlier."""
        out: set[int] = set()
        for s in STAGES[: STAGES.index(stage) + 1]:
            out |= self.at_stage.get(s, frozenset())
        return frozenset(out)


@dataclass
class SimulationReport:
    result: SecAggResult
    #: Sum of the clipped float updates of the contributors (what `result.sum` estimates).
    expected_sum: np.ndarray
    server_seconds: float
    client_seconds: dict[int, float]
    uploaded_bytes: dict[int, int]
    downloaded_bytes: dict[int, int]
    #: Clients the server excluded when they sent a message (index -> reason).
    refused: dict[int, str] = field(default_factory=dict)
    #: recipient -> senders whose relayed shares it could not decrypt (server.complaints).
    complaints: dict[int, frozenset[int]] = field(default_factory=dict)


def run_round(
    updates: Callable[[int], np.ndarray],
    *,
    num_clients: int,
    vector_length: int,
    config: SecAggConfig,
    dropouts: DropoutPlan | None = None,
    restart_server: bool = False,
    seed: int = 0,
    track_expected: bool = True,
    tamper: Callable[[Stage, int, bytes], bytes] | None = None,
    graph_seed: bytes | None = None,
) -> SimulationReport:
    """Run one secure round; raises the protocol's error if the round fails.

    `updates(i)` yields client i's float vector (generated lazily: at 1000 x 100k the
    stacked updates would not fit the budget). With `restart_server`, the server is
    rebuilt from its bytes after every stage and halfway through every collection.
    `tamper(stage, client, wire_bytes)` may alter a client's message in flight; a client
    the server excludes for it (ClientExcludedError) is left out, as the daemon does.
    `graph_seed` fixes the neighbour graph (default: fresh randomness, as in production).
    """
    server = SecAggServer(
        config.resolve(num_clients), vector_length=vector_length, graph_seed=graph_seed
    )
    simulated = _SimulatedRound(
        server,
        updates,
        plan=dropouts or DropoutPlan(),
        restart_server=restart_server,
        track_expected=track_expected,
        tamper=tamper,
    )
    simulated.set_up_clients(num_clients, seed)
    for stage in STAGES:
        simulated.run_stage(stage)
    return simulated.finish()


# How the server reads each stage's client message off the wire.
_DECODERS: dict[Stage, Callable[[bytes], ClientMessage]] = {
    Stage.ADVERTISE_KEYS: AdvertiseKeys.from_bytes,
    Stage.SHARE_KEYS: ShareKeys.from_bytes,
    Stage.MASKED_INPUT: MaskedInput.from_bytes,
    Stage.UNMASK: UnmaskResponse.from_bytes,
}
# How a client reads the server message it answers in each stage after the first.
_REQUEST_DECODERS: dict[Stage, Callable[[bytes], object]] = {
    Stage.SHARE_KEYS: KeysBroadcast.from_bytes,
    Stage.MASKED_INPUT: SharesDelivery.from_bytes,
    Stage.UNMASK: UnmaskRequest.from_bytes,
}


class _SimulatedRound:
    """The server, its clients and the wire between them, with what each party spent."""

    def __init__(
        self,
        server: SecAggServer,
        updates: Callable[[int], np.ndarray],
        *,
        plan: DropoutPlan,
        restart_server: bool,
        track_expected: bool,
        tamper: Callable[[Stage, int, bytes], bytes] | None,
    ) -> None:
        self.server = server
        self.updates = updates
        self.plan = plan
        self.restart_server = restart_server
        self.track_expected = track_expected
        self.tamper = tamper
        self.clients: dict[int, SecAggClient] = {}
        self.server_time = 0.0
        self.client_time: dict[int, float] = {}
        self.up: dict[int, int] = {}
        self.down: dict[int, int] = {}
        self.refused: dict[int, str] = {}
        self.expected = np.zeros(server.vector_length, np.float64)

    def set_up_clients(self, num_clients: int, seed: int) -> None:
        """Each client built from its RoundSetup, as it arrives over the wire."""
        for i in range(num_clients):
            setup_bytes = self.server.setup_for(i).to_bytes()
            self.down[i] = len(setup_bytes)
            self.up[i] = 0
            t0 = time.perf_counter()
            self.clients[i] = SecAggClient(
                RoundSetup.from_bytes(setup_bytes), rng=np.random.default_rng([seed, i])
            )
            self.client_time[i] = time.perf_counter() - t0

    def run_stage(self, stage: Stage) -> None:
        """Every client still talking sends its message; then the server closes the stage."""
        senders = sorted(self.server.active_clients() - self.plan.silent(stage))
        for n_done, i in enumerate(senders):
            if not self._exchange(stage, i):
                continue  # refused: the round goes on without it
            if stage == Stage.MASKED_INPUT and self.track_expected:
                clip = self.server.params.clipping_range
                update = np.asarray(self.updates(i), np.float64).reshape(-1)
                self.expected += np.clip(update, -clip, clip)
            if self.restart_server and n_done == len(senders) // 2:
                self._reload()
        self._on_server(self.server.close_stage)
        self._reload()

    def finish(self) -> SimulationReport:
        result = self._on_server(self.server.result)
        return SimulationReport(
            result,
            self.expected,
            self.server_time,
            self.client_time,
            self.up,
            self.down,
            self.refused,
            dict(self.server.complaints),
        )

    def _exchange(self, stage: Stage, i: int) -> bool:
        """Client i answers the server's message of `stage`; False if the server refused it."""
        request = None
        if stage != Stage.ADVERTISE_KEYS:
            wire = self._on_server(lambda: self.server.message_for(i).to_bytes())
            self.down[i] += len(wire)
            request = _REQUEST_DECODERS[stage](wire)
        t0 = time.perf_counter()
        reply = _client_step(self.clients[i], stage, request, self.updates, i)
        self.client_time[i] += time.perf_counter() - t0
        wire = reply.to_bytes()
        if self.tamper is not None:
            wire = self.tamper(stage, i, wire)
        self.up[i] += len(wire)
        try:
            self._on_server(lambda: self.server.receive(_DECODERS[stage](wire)))
        except ClientExcludedError as e:
            self.refused[i] = e.reason
            return False
        return True

    def _on_server(self, work: Callable[[], _T]) -> _T:
        """Run `work` and count its time as the server's (also when it raises)."""
        t0 = time.perf_counter()
        try:
            return work()
        finally:
            self.server_time += time.perf_counter() - t0

    def _reload(self) -> None:
        """With restart_server, a new server from the old one's persisted bytes."""
        if self.restart_server:
            self.server = SecAggServer.from_bytes(self.server.to_bytes())


_REQUEST_OF_STAGE: dict[Stage, type] = {
    Stage.SHARE_KEYS: KeysBroadcast,
    Stage.MASKED_INPUT: SharesDelivery,
    Stage.UNMASK: UnmaskRequest,
}
"""The server message a client answers in each stage after advertising its keys."""


def _client_step(
    client: SecAggClient,
    stage: Stage,
    request: object,
    updates: Callable[[int], np.ndarray],
    i: int,
):
    if stage == Stage.ADVERTISE_KEYS:
        return client.advertise_keys()
    expected = _REQUEST_OF_STAGE[stage]
    if not isinstance(request, expected):
        raise ProtocolError(
            f"stage {stage.value}: expected a {expected.__name__}, got {type(request).__name__}"
        )
    if isinstance(request, KeysBroadcast):
        return client.share_keys(request)
    if isinstance(request, SharesDelivery):
        return client.masked_input(request, updates(i))
    if isinstance(request, UnmaskRequest):
        return client.unmask(request)
    raise ProtocolError(f"stage {stage.value}: no client step answers {type(request).__name__}")
