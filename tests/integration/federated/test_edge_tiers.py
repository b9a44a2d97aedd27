"""Device -> edge -> cloud with real processes: the cloud `sporenet-server`, two
`sporenet-edge` subprocesses, four in-process device Clients. The hierarchical job must
publish the model a one-tier job computes from the same device updates (FedAvg over all
devices, then the cloud's strategy step), with and without SecAgg+ at the edges."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sporenet.federated.server.status import read_status
from sporenet.federated.strategies import make_strategy
from tests.integration.federated.edge_helpers import (
    SAMPLES,
    EdgeProcess,
    assert_every_device_has,
    fedavg_delta,
    join_all,
    run_devices_behind,
    serving,
    tier_logs,
)
from tests.integration.federated.helpers import ServerProcess, make_model

ROUNDS = 2


def cloud_toml(tmp_path: Path, strategy: dict[str, Any], extra: str = "") -> Path:
    path = tmp_path / "cloud.toml"
    options = "".join(f"{k} = {v!r}\n" for k, v in strategy.items() if k != "name")
    path.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = {ROUNDS}\nmin_clients = 2\n{extra}'
        f'[strategy]\nname = "{strategy["name"]}"\n{options}'
    )
    return path


def reference(w0: dict[str, np.ndarray], strategy: dict[str, Any]) -> dict[str, np.ndarray]:
    """The one-tier job: each round FedAvg over all four devices, then the strategy's step."""
    options = {k: v for k, v in strategy.items() if k != "name"}
    s = make_strategy(strategy["name"], options)
    w, state = dict(w0), {}
    for r in range(1, ROUNDS + 1):
        config = {"round": r, "rounds": ROUNDS, **s.fit_config(r)}
        w, state = s.apply(w, fedavg_delta(w, SAMPLES, config), state)
    return w


def run_tiers(
    tmp_path: Path,
    server_factory: Callable[..., ServerProcess],
    edge_factory: Callable[..., EdgeProcess],
    strategy: dict[str, Any],
    *,
    edge_toml: str = "",
    cloud_extra: str = "",
    evaluate: bool = False,
) -> tuple[ServerProcess, list[EdgeProcess], dict[int, Any], list[dict[str, Any]]]:
    cloud = server_factory(["--config", str(cloud_toml(tmp_path, strategy, cloud_extra))])
    cloud.start()
    args = ["--min-clients", "2"]
    if edge_toml:
        (tmp_path / "edge.toml").write_text(edge_toml)
        args += ["--config", str(tmp_path / "edge.toml")]
    edges = serving([edge_factory(f"edge{e}", cloud.address, args) for e in (0, 1)])
    threads, results, configs = run_devices_behind(edges, evaluate=evaluate)
    join_all(threads, 120, tier_logs(cloud, edges))
    return cloud, edges, results, configs


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "fedprox", "proximal_mu": 0.5},
        {"name": "fedadam", "eta": 0.05, "tau": 0.001},
    ],
    ids=["fedprox", "fedadam"],
)
def test_hierarchical_rounds_equal_direct_rounds(
    tmp_path: Path, server_factory, edge_factory, strategy: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    cloud, edges, results, configs = run_tiers(tmp_path, server_factory, edge_factory, strategy)
    want = reference(w0, strategy)
    assert sorted(results) == [0, 1, 2, 3]
    assert_every_device_has(results, want)
    if strategy["name"] == "fedprox":  # the cloud's mu reached the devices through the edges
        assert {c["proximal_mu"] for c in configs} == {0.5}
    # The cloud saw two participants per round, weighted by their devices' sample counts.
    rounds = [r for r in read_status(cloud.state_dir)["rounds"] if r["phase"] == "fit"]
    assert [r["num_results"] for r in rounds] == [2] * ROUNDS
    assert [e.events("edge_round_aggregated")[0]["weight"] for e in edges] == [15, 60]


def test_fedavg_with_evaluation_through_edges(tmp_path: Path, server_factory, edge_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    strategy = {"name": "fedavg"}
    cloud, _, results, _ = run_tiers(
        tmp_path,
        server_factory,
        edge_factory,
        strategy,
        cloud_extra="evaluate_every = 1\n",
        evaluate=True,
    )
    want = reference(w0, strategy)
    assert_every_device_has(results, want)
    # Each edge reports its devices' sample-weighted loss with their total sample count, so
    # the cloud's evaluation is the sample-weighted mean over all four devices.
    total = sum(SAMPLES)
    loss = sum(n * (i + 1) for i, n in enumerate(SAMPLES)) / total
    accuracy = sum(n * 0.1 * i for i, n in enumerate(SAMPLES)) / total
    evals = [r for r in read_status(cloud.state_dir)["rounds"] if r["phase"] == "evaluate"]
    assert len(evals) == ROUNDS
    for r in evals:
        assert r["num_results"] == 2
        assert r["metrics"]["loss"] == pytest.approx(loss, rel=1e-12)
        assert r["metrics"]["accuracy"] == pytest.approx(accuracy, rel=1e-12)


SECURE_EDGE = """\
[secure_aggregation]
enabled = true
clipping_range = 8.0
max_weight = 100
stage_timeout = 60
"""


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "fedavg"},
        {"name": "fedprox", "proximal_mu": 0.5},
        {"name": "fedadam", "eta": 0.05, "tau": 0.001},
    ],
    ids=["fedavg", "fedprox", "fedadam"],
)
def test_secure_aggregation_at_the_edges_equals_direct_fedavg(
    tmp_path: Path, server_factory, edge_factory, strategy: dict[str, Any]
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    _cloud, edges, results, _ = run_tiers(
        tmp_path, server_factory, edge_factory, strategy, edge_toml=SECURE_EDGE
    )
    want = reference(w0, strategy)
    # Fixed-point encoding: each coordinate of a secure mean is within one step
    # (clipping_range / (2^(q-1) - 1)) of the plain mean.
    assert_every_device_has(results, want, atol=1e-5)
    for edge in edges:  # the edges aggregated masked sums, weighted by max_weight
        done = edge.events("edge_round_aggregated")
        assert len(done) == ROUNDS and "secure_error_bound" in done[0], edge.logs()
    assert [e.events("edge_round_aggregated")[0]["weight"] for e in edges] == [15, 60]


@pytest.mark.parametrize("strategy", ["median", "krum"])
def test_cloud_refuses_an_edge_when_its_strategy_needs_individual_updates(
    tmp_path: Path, server_factory, edge_factory, strategy: str
) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    cloud = server_factory(["--config", str(cloud_toml(tmp_path, {"name": strategy}))]).start()
    edge = edge_factory("edge0", cloud.address, ["--name", "edge-a"]).start()
    assert edge.proc is not None
    assert edge.proc.wait(120) == 1, edge.logs()
    # The edge says why, in the cloud's words (FAILED_PRECONDITION's details).
    assert "sporenet-edge: error: the cloud refused this edge:" in edge.logs()
    assert f"strategy {strategy!r} needs every device's update" in edge.logs()
    refused = cloud.events("edge_refused")
    assert refused and refused[0]["client"] == "edge-a"
    assert read_status(cloud.state_dir)["clients_registered"] == 0
