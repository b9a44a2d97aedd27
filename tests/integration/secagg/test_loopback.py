"""Secure rounds over real gRPC on loopback: dropouts at every stage, a mid-round restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated.secagg import SecAggConfig, Stage
from tests.integration.secagg.loopback import SecAggService, run_client

TEMPLATE = {"dense/w": ((20, 30), np.dtype(np.float32)), "dense/b": ((30,), np.dtype(np.float32))}
N = 20
# 16 neighbours, threshold 9: any 30% of the 20 clients can drop at one stage and every
# client still keeps a majority of its share holders.


def _updates() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {
        f"c{i}": {
            name: rng.normal(0, 0.3, shape).astype(dtype)
            for name, (shape, dtype) in TEMPLATE.items()
        }
        for i in range(N)
    }


def _run(tmp_path: Path, drops: dict[str, Stage], restart_at: Stage | None = None):
    updates = _updates()
    service = SecAggService(tmp_path / "state.sqlite")
    service.start_round(
        SecAggConfig(num_neighbours=16, clipping_range=1.0), list(updates), TEMPLATE
    )
    service.serve()
    current = {"service": service}
    outcomes: dict[str, str] = {}

    def client(cid: str, seed: int) -> None:
        outcomes[cid] = run_client(
            lambda: current["service"].port, cid, TEMPLATE, updates[cid], drops.get(cid), seed
        )

    threads = [threading.Thread(target=client, args=(cid, i)) for i, cid in enumerate(updates)]
    for t in threads:
        t.start()
    if restart_at is not None:
        # Crash the server once half the clients have answered in `restart_at`.
        while not (service.round.stage == restart_at and len(service.round.pending()) <= N // 2):
            time.sleep(0.005)
        service.stop()
        restarted = SecAggService(tmp_path / "state.sqlite")
        assert restarted.round is not None and restarted.round.stage == restart_at
        restarted.serve()
        current["service"] = restarted
    for t in threads:
        t.join(90)
    final = current["service"]
    final.stop()
    return final, outcomes, updates


def _check_mean(service: SecAggService, updates) -> list[str]:
    mean, contributors = service.round.result()
    bound = service.round.server.result().error_bound / len(contributors)
    for name in TEMPLATE:
        want = np.mean([np.clip(updates[c][name], -1, 1) for c in contributors], axis=0)
        assert np.max(np.abs(mean[name].astype(np.float64) - want)) <= bound + 1e-6  # float32 out
    return contributors


@pytest.mark.parametrize("rate", [0.1, 0.3])
@pytest.mark.parametrize(
    "stage", [Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK]
)
def test_round_survives_dropouts_at_each_stage(tmp_path: Path, stage: Stage, rate: float) -> None:
    dropped = [f"c{i}" for i in range(0, N, round(1 / rate))][: round(rate * N)]
    service, outcomes, updates = _run(tmp_path, dict.fromkeys(dropped, stage))
    assert service.round.stage == Stage.COMPLETED, service.failure
    contributors = _check_mean(service, updates)
    # Clients that dropped before uploading are left out; after uploading they still count.
    if stage == Stage.UNMASK:
        assert len(contributors) == N
    else:
        assert set(contributors) == set(updates) - set(dropped)
    assert all(outcomes[c] == "dropped" for c in dropped)
    assert all(outcomes[c] == "completed" for c in updates if c not in dropped)


def test_round_without_dropouts_and_restart_mid_upload(tmp_path: Path) -> None:
    service, outcomes, updates = _run(tmp_path, {}, restart_at=Stage.MASKED_INPUT)
    assert service.round.stage == Stage.COMPLETED, service.failure
    assert sorted(_check_mean(service, updates)) == sorted(updates)
    assert set(outcomes.values()) == {"completed"}


def test_restart_mid_unmask_with_dropouts(tmp_path: Path) -> None:
    drops = {"c1": Stage.MASKED_INPUT, "c2": Stage.MASKED_INPUT}
    service, _, updates = _run(tmp_path, drops, restart_at=Stage.UNMASK)
    assert service.round.stage == Stage.COMPLETED, service.failure
    assert set(_check_mean(service, updates)) == set(updates) - {"c1", "c2"}


def test_too_many_dropouts_fail_the_round_for_everyone(tmp_path: Path) -> None:
    drops = {f"c{i}": Stage.MASKED_INPUT for i in range(12)}  # 8 left < threshold 9
    service, outcomes, _ = _run(tmp_path, drops)
    assert service.round.stage == Stage.FAILED
    assert "threshold" in service.failure
    assert {outcomes[f"c{i}"] for i in range(12, N)} == {"failed"}
