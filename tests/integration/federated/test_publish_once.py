"""A full disk at publish: the round is published once the disk has room again, with its
privacy charged once and its noise drawn once, and the failure logged once with its
cause and then summarised, not as a traceback per retry.

The disk is filled for real, at the file system: the running server's RLIMIT_FSIZE is
lowered below the model's size, so writing the new model version fails with EFBIG (as
ENOSPC would), then raised again.
"""

from __future__ import annotations

import json
import resource
import threading
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.server.status import read_status
from tests.integration.federated.helpers import make_model, register_raw, wait_for

pytestmark = pytest.mark.skipif(
    not hasattr(resource, "prlimit"), reason="needs Linux's prlimit to fill the disk"
)
LIMIT = 1 << 20  # the model is 2 MiB: writing it fails, the database's small writes do not


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_a_full_disk_at_publish_spends_privacy_once(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore", out=512, inp=1024)
    cfg = tmp_path / "s.toml"
    # Three clients are selected; the third never answers, so the phase closes at its
    # deadline, after the two updates are in and the disk is full.
    cfg.write_text(
        f'model = "{tmp_path / "init.spore"}"\nrounds = 1\nmin_clients = 2\n'
        "min_available = 3\nround_timeout = 4\nheartbeat_timeout = 60\nmetrics_port = 0\n"
        "[differential_privacy]\nenabled = true\nnoise_multiplier = 1.0\n"
        "clipping_norm = 1.0\ndelta = 1e-5\n"
    )
    server = server_factory(["--config", str(cfg)]).start()
    assert server.proc is not None
    port = json.loads((server.state_dir / "server.json").read_text())["metrics_port"]
    with grpc.insecure_channel(server.address) as channel:
        register_raw(channel, ["idle"])

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: w + 0.01 for k, w in weights.items()}, 10, {}

    clients = [
        Client(server.address, train=train, name=f"c{i}", poll_wait=1.0, max_backoff=0.5)
        for i in range(2)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for t in threads:
        t.start()

    def both_accepted() -> bool:
        s = read_status(server.state_dir)["participants"]
        return s.get("c0") == "accepted" and s.get("c1") == "accepted"

    wait_for(both_accepted, 120, what="both updates")
    infinite = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))
    try:
        wait_for(
            lambda: _metric(port, "sporenet_tick_failures_total") >= 20,
            120,
            what="20 failed publish attempts",
        )
    finally:
        resource.prlimit(server.proc.pid, resource.RLIMIT_FSIZE, infinite)
    wait_for(lambda: server.events("job_finished"), 120, what="the job to finish")
    for t in threads:
        t.join(60)

    privacy = read_status(server.state_dir)["privacy"]
    assert [r["round"] for r in privacy["rounds"]] == [1], privacy["rounds"]
    assert privacy["epsilon"] == privacy["rounds"][0]["epsilon"]
    (spent,) = server.events("privacy_spent")
    assert spent["epsilon"] == privacy["epsilon"]
    (published,) = server.events("round_published")
    assert published["failed_attempts"] >= 20 and published["epsilon"] == privacy["epsilon"]
    # The model written is the one drawn first: one publication, one draw of the noise.
    assert sorted(p.name for p in (server.state_dir / "models").glob("*.spore")) == [
        "v00000.spore",
        "v00001.spore",
    ]
    (failed,) = server.events("tick_failed")
    assert "File too large" in failed["error"] and "exception" in failed, failed
    (recovered,) = server.events("tick_failed_recovered")
    assert recovered["failures"] >= 20, recovered
    tracebacks = [line for line in server.logs().splitlines() if '"exception"' in line]
    assert len(tracebacks) == 1, len(tracebacks)
    assert server.terminate() == 0
