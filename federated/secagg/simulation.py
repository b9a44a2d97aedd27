"""In-process driver: one full secure round for n clients with dropouts at each stage.

Every message goes through its wire form (to_bytes/from_bytes), so byte counts are real,
and the server can be rebuilt from its persisted bytes between stages or mid-stage to
exercise a restart. Used by the tests and benchmarks/secure_aggregation.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

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
    plan = dropouts or DropoutPlan()
    server = SecAggServer(
        config.resolve(num_clients), vector_length=vector_length, graph_seed=graph_seed
    )
    server_time = 0.0
    client_time = dict.fromkeys(range(num_clients), 0.0)
    up = dict.fromkeys(range(num_clients), 0)
    down = dict.fromkeys(range(num_clients), 0)
    expected = np.zeros(vector_length, np.float64)
    clip = server.params.clipping_range

    def reload(s: SecAggServer) -> SecAggServer:
        return SecAggServer.from_bytes(s.to_bytes()) if restart_server else s

    refused: dict[int, str] = {}
    clients: dict[int, SecAggClient] = {}
    for i in range(num_clients):
        setup_bytes = server.setup_for(i).to_bytes()
        down[i] += len(setup_bytes)
        t0 = time.perf_counter()
        clients[i] = SecAggClient(
            RoundSetup.from_bytes(setup_bytes), rng=np.random.default_rng([seed, i])
        )
        client_time[i] += time.perf_counter() - t0

    decoders: dict[Stage, Callable[[bytes], ClientMessage]] = {
        Stage.ADVERTISE_KEYS: AdvertiseKeys.from_bytes,
        Stage.SHARE_KEYS: ShareKeys.from_bytes,
        Stage.MASKED_INPUT: MaskedInput.from_bytes,
        Stage.UNMASK: UnmaskResponse.from_bytes,
    }
    incoming = {
        Stage.SHARE_KEYS: KeysBroadcast,
        Stage.MASKED_INPUT: SharesDelivery,
        Stage.UNMASK: UnmaskRequest,
    }

    for stage in STAGES:
        senders = sorted(server.active_clients() - plan.silent(stage))
        for n_done, i in enumerate(senders):
            client = clients[i]
            request = None
            if stage != Stage.ADVERTISE_KEYS:
                t0 = time.perf_counter()
                wire = server.message_for(i).to_bytes()
                server_time += time.perf_counter() - t0
                down[i] += len(wire)
                request = incoming[stage].from_bytes(wire)  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            reply = _client_step(client, stage, request, updates, i)
            client_time[i] += time.perf_counter() - t0
            wire = reply.to_bytes()
            if tamper is not None:
                wire = tamper(stage, i, wire)
            up[i] += len(wire)
            t0 = time.perf_counter()
            try:
                server.receive(decoders[stage](wire))
            except ClientExcludedError as e:
                refused[i] = e.reason
                continue
            finally:
                server_time += time.perf_counter() - t0
            if stage == Stage.MASKED_INPUT and track_expected:
                expected += np.clip(np.asarray(updates(i), np.float64).reshape(-1), -clip, clip)
            if restart_server and n_done == len(senders) // 2:
                server = reload(server)
        t0 = time.perf_counter()
        server.close_stage()
        server_time += time.perf_counter() - t0
        server = reload(server)

    t0 = time.perf_counter()
    result = server.result()
    server_time += time.perf_counter() - t0
    return SimulationReport(
        result, expected, server_time, client_time, up, down, refused, dict(server.complaints)
    )


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
    return client.unmask(request)
