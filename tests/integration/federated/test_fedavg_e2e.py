"""A full multi-round FedAvg job: the real daemon as a subprocess, real clients on loopback."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import numpy as np
from grpc_health.v1 import health_pb2

from sporenet.federated import Client
from tests.integration.federated.helpers import free_port, make_model, status_command

SAMPLES = [10, 30, 60]
ROUNDS = 3


def local_step(i: int, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Client i's deterministic 'training': different per client, easy to reproduce."""
    return {
        k: (v * (1.0 - 0.1 * (i + 1)) + 0.05 * (i + 1)).astype(np.float32) for k, v in w.items()
    }


def expected_fedavg(
    w0: dict[str, np.ndarray], rounds: int, clients: list[int]
) -> dict[str, np.ndarray]:
    w = {k: v.astype(np.float32) for k, v in w0.items()}
    for _ in range(rounds):
        total = sum(SAMPLES[i] for i in clients)
        w = {
            k: sum(SAMPLES[i] * local_step(i, w)[k].astype(np.float64) for i in clients) / total
            for k in w
        }
        w = {k: v.astype(np.float32) for k, v in w.items()}
    return w


def test_fedavg_rounds_match_numpy_and_ops_endpoints(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    metrics_port = free_port()
    server = server_factory(
        [
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            str(ROUNDS),
            "--min-clients",
            "3",
            "--evaluate-every",
            "1",
            "--metrics-port",
            str(metrics_port),
            "--keep-serving",  # /metrics and SIGTERM are checked after the job
        ]
    ).start()
    assert server.health() == health_pb2.HealthCheckResponse.SERVING

    results: dict[int, dict[str, np.ndarray] | None] = {}
    seen_configs: list[dict] = []
    taken: dict[int, list[bytearray]] = {}  # the buffers each client's models and updates used

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            seen_configs.append(config)
            return local_step(i, weights), SAMPLES[i], {"loss": float(i)}

        def evaluate(weights: dict[str, np.ndarray], config: dict) -> tuple:
            return float(i), SAMPLES[i], {"acc": 1.0 / (i + 1)}

        client = Client(server.address, train=train, evaluate=evaluate, name=f"c{i}", poll_wait=2.0)
        taken[i] = []
        take = client._buffers.take

        def counting_take(size: int) -> memoryview:
            view = take(size)
            taken[i].append(view.obj)  # a reference, not a view: reuse is not blocked
            return view

        client._buffers.take = counting_take  # type: ignore[method-assign]
        results[i] = client.run()
        client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()

    expected = expected_fedavg(w0, ROUNDS, [0, 1, 2])
    for i in range(3):
        final = results[i]
        assert final is not None
        for k in expected:
            np.testing.assert_allclose(final[k], expected[k], rtol=1e-5, atol=1e-6)
    assert {c["round"] for c in seen_configs} == {1, 2, 3}
    # Models and updates reuse the buffers of the round before (results above: correctly).
    # 3 updates and 4 models (initial, two evaluated, final) in two buffers per client.
    for buffers in taken.values():
        assert len(buffers) >= 7 and len({id(b) for b in buffers}) == 2

    # Prometheus text endpoint.
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    assert f"sporenet_rounds_completed_total {ROUNDS}" in body
    assert f"sporenet_updates_accepted_total {3 * ROUNDS}" in body

    # SIGTERM: graceful, exit code 0, state persisted.
    assert server.terminate() == 0
    assert server.events("server_stopped")

    # `status` reads the state dir after the fact.
    status = status_command(server.state_dir)
    assert status["job"]["status"] == "finished"
    assert status["model"]["version"] == ROUNDS
    fits = [r for r in status["rounds"] if r["phase"] == "fit"]
    evals = [r for r in status["rounds"] if r["phase"] == "evaluate"]
    assert [r["num_results"] for r in fits] == [3, 3, 3]
    total = sum(SAMPLES)
    # Evaluation metrics are sample-weighted means of what clients reported.
    expected_loss = sum(SAMPLES[i] * i for i in range(3)) / total
    expected_acc = sum(SAMPLES[i] / (i + 1) for i in range(3)) / total
    assert len(evals) == ROUNDS
    assert abs(evals[-1]["metrics"]["loss"] - expected_loss) < 1e-9
    assert abs(evals[-1]["metrics"]["acc"] - expected_acc) < 1e-9
    assert fits[0]["metrics"]["num_samples"] == total
