"""kill -9 across tiers: an edge, then the cloud, dies mid-round and restarts on its state
dir; no accepted update is lost (nobody trains a round twice, the restarted process
re-folds what it had accepted) and the job publishes the one-tier FedAvg model."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.federated.server.status import read_status
from tests.integration.federated.edge_helpers import (
    SAMPLES,
    assert_every_device_has,
    fedavg_delta,
    join_all,
    local_train,
    run_devices_behind,
    serving,
    tier_logs,
)
from tests.integration.federated.helpers import make_model, wait_for

ROUNDS = 2


def fedavg_reference(w0: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    w = dict(w0)
    for r in range(1, ROUNDS + 1):
        delta = fedavg_delta(w, SAMPLES, {"round": r})
        w = {k: (v + delta[k]).astype(v.dtype) for k, v in w.items()}
    return w


def fedavg_behind_edge_1(w0: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One round of FedAvg over edge 1's devices (2 and 3) alone."""
    want = {}
    for k, w in w0.items():
        acc = sum(SAMPLES[i] * (local_train(i, w0, {})[k] - w).astype(np.float64) for i in (2, 3))
        want[k] = (w + (acc / (SAMPLES[2] + SAMPLES[3])).astype(np.float32)).astype(np.float32)
    return want


def held_in_round_1(device: int, release: threading.Event) -> Callable[[int, dict], None]:
    def gate(i: int, config: dict[str, Any]) -> None:
        if i == device and config["round"] == 1:
            release.wait(120)

    return gate


def accepted(state_dir: Path) -> int:
    """Updates the process in `state_dir` has accepted in its open phase (from its store)."""
    if not (state_dir / "state.db").exists():
        return 0  # the edge has no job before the cloud's first task
    s = read_status(state_dir)
    return sum(1 for st in s["participants"].values() if st == "accepted") if s["job"] else 0


def trained_once_per_round(configs: list[dict[str, Any]]) -> None:
    counts = Counter((c["device"], c["round"]) for c in configs)
    assert counts == {(i, r): 1 for i in range(4) for r in range(1, ROUNDS + 1)}, counts


def test_kill9_of_an_edge_mid_round_loses_no_accepted_update(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    cloud = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", str(ROUNDS), "--min-clients", "2"]
    ).start()
    args = ["--min-clients", "2", "--checkpoint-every", "1"]
    edges = serving([edge_factory(f"edge{e}", cloud.address, args) for e in (0, 1)])
    release = threading.Event()
    threads, results, configs = run_devices_behind(edges, gate=held_in_round_1(1, release))
    # Edge 0 accepted device 0's round-1 update; device 1 is still training.
    wait_for(lambda: accepted(edges[0].state_dir) == 1, timeout=60, what="edge 0's first update")
    edges[0].kill9()
    edges[0].start()
    release.set()

    join_all(threads, 120, tier_logs(cloud, edges))
    restored = edges[0].events("aggregate_restored")
    assert restored and restored[0]["checkpointed"] + restored[0]["refolded"] == 1
    trained_once_per_round(configs)  # device 0 was not asked for its update again
    want = fedavg_reference(w0)
    assert_every_device_has(results, want)
    # The cloud kept the restarted edge as the same participant.
    assert read_status(cloud.state_dir)["clients_registered"] == 2


def test_kill9_of_the_cloud_mid_round_loses_no_accepted_update(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    cloud = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            str(ROUNDS),
            "--min-clients",
            "2",
            "--checkpoint-every",
            "1",
        ]
    ).start()
    args = ["--min-clients", "2"]
    edges = serving([edge_factory(f"edge{e}", cloud.address, args) for e in (0, 1)])
    release = threading.Event()
    threads, results, configs = run_devices_behind(edges, gate=held_in_round_1(3, release))
    # The cloud accepted edge 0's partial aggregate; edge 1 waits for device 3.
    wait_for(lambda: accepted(cloud.state_dir) == 1, timeout=60, what="edge 0's partial")
    cloud.kill9()
    cloud.start()
    release.set()

    join_all(threads, 120, tier_logs(cloud, edges))
    restored = cloud.events("aggregate_restored")
    assert restored and restored[0]["checkpointed"] + restored[0]["refolded"] == 1
    trained_once_per_round(configs)
    # Each edge aggregated each round once: edge 0's round-1 partial was not recomputed.
    assert [len(e.events("edge_round_aggregated")) for e in edges] == [ROUNDS, ROUNDS]
    want = fedavg_reference(w0)
    assert_every_device_has(results, want)


def test_an_edge_short_of_devices_at_its_deadline_withdraws_and_the_cloud_goes_on(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    cloud = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            "1",
            "--min-available",
            "2",
            "--round-timeout",
            "6",  # after edge 0's 2 s: it withdraws, then the cloud closes without it
        ]
    ).start()
    edges = serving(
        [
            edge_factory(f"edge{e}", cloud.address, ["--min-clients", "2", *extra])
            for e, extra in ((0, ["--round-timeout", "2"]), (1, []))
        ]
    )
    release = threading.Event()
    threads, results, _ = run_devices_behind(edges, gate=held_in_round_1(1, release))
    # Device 1 never reports: edge 0 has 1 of its min_clients=2 updates at its deadline.
    wait_for(
        lambda: read_status(cloud.state_dir)["job"]["status"] == "finished",
        timeout=60,
        what="the cloud to close the round without edge 0",
    )
    release.set()
    join_all(threads, 120, tier_logs(cloud, edges))

    withdrawn = edges[0].events("edge_task_withdrawn")
    assert (
        withdrawn
        and "1 device update(s) by the deadline, min_clients is 2" in (withdrawn[0]["reason"])
    )
    assert not edges[0].events("edge_round_aggregated")
    published = cloud.events("round_published")
    assert len(published) == 1 and published[0]["clients"] == 1
    assert_every_device_has(results, fedavg_behind_edge_1(w0))


def test_a_straggling_edge_drops_the_task_the_cloud_closed_and_joins_the_next_round(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    cloud = server_factory(
        [
            *("--model", str(tmp_path / "init.spore"), "--rounds", "2"),
            *("--min-clients", "1", "--min-available", "2"),
            *("--round-timeout", "3", "--heartbeat-interval", "0.3"),
        ]
    ).start()
    # Edge 0 would wait a minute for its slow device; the cloud closes after 3 s.
    args = ["--min-clients", "2", "--round-timeout", "60"]
    edges = serving([edge_factory(f"edge{e}", cloud.address, args) for e in (0, 1)])
    release = threading.Event()
    threads, results, _ = run_devices_behind(edges, gate=held_in_round_1(1, release))
    wait_for(
        lambda: bool(edges[0].events("edge_task_withdrawn")),
        timeout=60,
        what="edge 0 to drop the round the cloud closed",
    )
    release.set()  # device 1's round-1 update is now stale; it trains round 2
    join_all(threads, 120, tier_logs(cloud, edges))

    assert edges[0].events("edge_task_withdrawn")[0]["reason"] == ("the cloud closed task 'r1-fit'")
    assert [p["clients"] for p in cloud.events("round_published")] == [1, 2]
    # Round 1: FedAvg over edge 1's devices; round 2: over all four, from that model.
    w1 = fedavg_behind_edge_1(w0)
    delta = fedavg_delta(w1, SAMPLES, {"round": 2})
    assert_every_device_has(results, {k: w1[k] + delta[k] for k in w0})


SECURE_EDGE = """\
checkpoint_every = 1
[secure_aggregation]
enabled = true
clipping_range = 8.0
max_weight = 100
"""


def test_kill9_of_an_edge_mid_secure_round_loses_no_masked_input(
    tmp_path: Path, server_factory, edge_factory
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    cloud = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", str(ROUNDS), "--min-clients", "2"]
    ).start()
    (tmp_path / "edge.toml").write_text(SECURE_EDGE)
    args = ["--min-clients", "2", "--config", str(tmp_path / "edge.toml")]
    edges = serving([edge_factory(f"edge{e}", cloud.address, args) for e in (0, 1)])
    release = threading.Event()
    threads, results, configs = run_devices_behind(edges, gate=held_in_round_1(1, release))

    def device_0_masked() -> bool:
        if not (edges[0].state_dir / "state.db").exists():
            return False
        return read_status(edges[0].state_dir)["participants"].get("d0") == "masked"

    # Device 0's masked input is in edge 0's secure round; device 1 is still training.
    wait_for(device_0_masked, timeout=60, what="device 0's masked input at edge 0")
    edges[0].kill9()
    edges[0].start()
    release.set()

    join_all(threads, 120, tier_logs(cloud, edges))
    assert edges[0].events("secure_round_restored")[0]["stage"] == "masked_input"
    first = edges[0].events("edge_round_aggregated")[0]
    assert (first["clients"], first["weight"]) == (2, 15)  # both devices' inputs in the sum
    trained_once_per_round(configs)  # device 0 did not train round 1 again
    want = fedavg_reference(w0)
    assert_every_device_has(results, want, atol=1e-5)
