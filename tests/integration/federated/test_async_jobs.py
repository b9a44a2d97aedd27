"""Buffered asynchronous jobs on a real daemon with SDK clients on loopback: every
published version is the staleness-weighted mean of the updates its buffer recorded,
also across a kill -9 mid-buffer (no accepted update lost, none folded twice)."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.server.status import read_status
from sporenet.federated.strategies.staleness import make_staleness
from sporenet.lite import read_weights
from tests.integration.federated.helpers import make_model, wait_for

SAMPLES = [5, 10, 20, 40]
EXPONENT = 0.5


def shift(i: int) -> float:
    """Client i's update is this constant everywhere, whatever version it trained on."""
    return 0.01 * (i + 1)


def check_versions(
    state_dir: Path, w0: dict[str, np.ndarray], versions: int, *, atol: float = 1e-6
) -> list[int]:
    """Every published version against a float64 reference built from what the store
    recorded for its buffer (who, how many samples, how stale); the buffer sizes."""
    staleness = make_staleness("polynomial", {"exponent": EXPONENT})
    con = sqlite3.connect(state_dir / "state.db")
    try:
        rows = con.execute(
            "SELECT round, client_id, num_samples, metrics FROM participants"
            " WHERE phase = 'fit' AND status = 'accepted' ORDER BY round"
        ).fetchall()
    finally:
        con.close()
    sizes, w = [], {k: v.astype(np.float64) for k, v in w0.items()}
    for version in range(1, versions + 1):
        members = [r for r in rows if r[0] == version]
        sizes.append(len(members))
        total = sum(n for _, _, n, _ in members)
        step = 0.0
        for _, cid, n, metrics in members:
            tau = int(json.loads(metrics)["staleness"])
            step += n * staleness.weight(tau) * shift(int(cid[1:]))
        w = {k: v + step / total for k, v in w.items()}
        path = state_dir / "models" / f"v{version:05d}.spore"
        got = read_weights(path.read_bytes())
        for k in w:
            np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=atol)
    return sizes


def run_clients(address: str, hold: threading.Event | None = None) -> list[threading.Thread]:
    """Four SDK clients; with `hold`, clients 1-3 wait for it in their tasks of buffer 2 on."""

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            if hold is not None and i > 0 and config["round"] >= 2:
                hold.wait(60)
            return {k: v + np.float32(shift(i)) for k, v in weights.items()}, SAMPLES[i], {}

        c = Client(address, train=train, name=f"c{i}", poll_wait=1.0, max_backoff=0.3)
        c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    return threads


def async_args(model: Path, *extra: str) -> list[str]:
    return [
        "--model",
        str(model),
        "--async",
        "--rounds",
        "4",
        "--min-clients",
        "1",
        "--min-available",
        "4",
        "--concurrency",
        "3",
        "--buffer-size",
        "2",
        "--keep-models",
        "0",
        *extra,
    ]


def test_an_async_job_publishes_one_staleness_weighted_version_per_buffer(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    server = server_factory(async_args(tmp_path / "init.spore")).start()
    threads = run_clients(server.address)
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), server.logs()
    # A buffer closes at the round loop's first tick after its second update; updates
    # accepted before that tick are folded into it too.
    assert all(size >= 2 for size in check_versions(server.state_dir, w0, 4))
    assert [e["version"] for e in server.events("round_published")] == [1, 2, 3, 4]
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished" and status["job"]["model_version"] == 4
    assert server.terminate() == 0


def test_kill9_mid_buffer_loses_no_accepted_update_and_folds_none_twice(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    args = async_args(tmp_path / "init.spore", "--checkpoint-every", "2")
    args[args.index("--buffer-size") + 1] = "3"
    server = server_factory(args).start()
    hold = threading.Event()
    threads = run_clients(server.address, hold)

    # Buffer 2 gets client 0's update and those of tasks handed out in buffer 1; the rest
    # are held, so it stays short of its three.
    def buffer2_accepted() -> int:
        s = read_status(server.state_dir)
        if s["job"]["round"] != 2:
            return 0
        return sum(st == "accepted" for st in s["participants"].values())

    wait_for(lambda: buffer2_accepted() >= 1, timeout=60, what="buffer 2 with an update")
    server.kill9()
    accepted = buffer2_accepted()
    server.start()
    hold.set()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), server.logs()
    (restored,) = server.events("aggregate_restored")
    assert restored["checkpointed"] + restored["refolded"] == accepted
    assert all(size >= 3 for size in check_versions(server.state_dir, w0, 4))
    assert server.terminate() == 0


@pytest.mark.slow  # about 35 s here (an edge daemon's start and exit); the reason is unit-tested
def test_an_async_job_refuses_an_edge_with_the_reason(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
    edge_factory,  # type: ignore[no-untyped-def]
) -> None:
    make_model(tmp_path / "init.spore")
    cloud = server_factory(async_args(tmp_path / "init.spore")).start()
    edge = edge_factory("edge0", cloud.address, ["--name", "edge-a"]).start()
    assert edge.proc is not None
    assert edge.proc.wait(120) == 1, edge.logs()
    assert "sporenet-edge: error: the cloud refused this edge:" in edge.logs()
    assert 'the job is asynchronous (job.mode = "async")' in edge.logs()
    refused = cloud.events("edge_refused")
    assert refused and refused[0]["client"] == "edge-a"
    assert cloud.terminate() == 0
