"""Dropouts and stragglers: a silent client is dropped, a late one is cut off at the deadline."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated import Client
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import make_model, poll_task, wait_for

NAMES = ["a", "b", "c", "d"]
SAMPLES = {"a": 10, "b": 20, "c": 30, "d": 40}


def step(name: str, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    k = NAMES.index(name) + 1
    return {n: (v * 0.9 + 0.1 * k).astype(np.float32) for n, v in w.items()}


def fedavg(w: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    total = sum(SAMPLES[n] for n in names)
    return {
        k: (sum(SAMPLES[n] * step(n, w)[k].astype(np.float64) for n in names) / total).astype(
            np.float32
        )
        for k in w
    }


def test_dropout_and_straggler(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    server = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "2",
            "--min-clients",
            "2",
            "--min-available",
            "4",
            "--round-timeout",
            "3",
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "1",
        ]
    ).start()
    # "d" registers and takes its round-1 task, then its process dies (no more calls).
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.FederatedStub(ch)
        stub.Register(pb.RegisterRequest(client_name="d"), timeout=5)

        results: dict[str, dict[str, np.ndarray] | None] = {}

        def round_one_closed() -> bool:
            rows = read_status(server.state_dir)["rounds"]
            return bool(rows) and rows[0]["finished_at"] is not None

        def run(name: str) -> None:
            def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
                if name == "c" and config["round"] == 1:
                    # A straggler: alive (heartbeats) but past the deadline, whatever the
                    # machine's load: it answers once round 1 has been published without it.
                    wait_for(round_one_closed, timeout=60, what="round 1 to close without it")
                return step(name, weights), SAMPLES[name], {}

            c = Client(server.address, train=train, name=name, poll_wait=1.0, max_backoff=0.3)
            results[name] = c.run()
            c.close()

        threads = {n: threading.Thread(target=run, args=(n,), daemon=True) for n in "abc"}
        for t in threads.values():
            t.start()
        for _ in range(100):
            task = poll_task(ch, "d", wait_ms=500)
            if task.type == pb.TASK_FIT:
                break
        assert task.type == pb.TASK_FIT
    wait_for(
        lambda: read_status(server.state_dir)["participants"].get("d") == "dropped",
        timeout=10,
        what="d to be dropped",
    )
    # d's device comes back as a fresh process: it sits out round 1 and joins round 2.
    threads["d"] = threading.Thread(target=run, args=("d",), daemon=True)
    threads["d"].start()
    for t in threads.values():
        t.join(40)
    assert not any(t.is_alive() for t in threads.values()), server.logs()

    want = fedavg(fedavg(w0, ["a", "b"]), ["a", "b", "c", "d"])
    for name in NAMES:
        got = results[name]
        assert got is not None
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    status = read_status(server.state_dir)
    assert [r["num_results"] for r in status["rounds"]] == [2, 4]
    assert server.events("clients_dropped")[0]["clients"] == ["d"]
