"""Uploads under load, with one receiving slot.

Each client waits in its Session stream for the server's go-ahead before it sends a byte
of its update, and every update lands in the aggregate exactly once. The clients' `train`
meets at a barrier, so all of them ask for the slot at about the same moment, and 2.4 MB
updates take long enough to drain through the single slot that most of them wait.

The same holds with the default transfer settings when `--max-upload-memory` holds only
one update: receiving slots are bounded by the memory their updates take.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated import Client
from tests.integration.federated.helpers import free_port, make_model, status_command

N_CLIENTS = 20
ROUNDS = 2
SAMPLES = [10 + 7 * i for i in range(N_CLIENTS)]  # distinct, so a lost or doubled update shows


def local_step(i: int, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Client i's deterministic 'training', different for every client."""
    a = 0.01 * (i + 1)
    return {k: (v * (1.0 - a) + a).astype(np.float32) for k, v in w.items()}


def expected_fedavg(w0: dict[str, np.ndarray], rounds: int) -> dict[str, np.ndarray]:
    w = {k: v.astype(np.float32) for k, v in w0.items()}
    total = sum(SAMPLES)
    for _ in range(rounds):
        w = {
            k: (
                sum(SAMPLES[i] * local_step(i, w)[k].astype(np.float64) for i in range(N_CLIENTS))
                / total
            ).astype(np.float32)
            for k in w
        }
    return w


def metric(body: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", body, re.MULTILINE)
    assert found is not None, f"{name} not in /metrics"
    return float(found.group(1))


# One receiving slot: the smallest transfer settings, --max-transfers 1 (one download slot,
# one receiving slot); or the default 8 transfers with room in memory for one 2.4 MB
# update (and less than two).
ONE_SLOT = {
    "max_transfers": {"--max-transfers": "1"},
    "upload_memory": {"--max-upload-memory": str(3 << 20)},
}


@pytest.mark.parametrize("limit", sorted(ONE_SLOT))
def test_uploads_wait_for_their_slot_and_every_update_counts_once(
    tmp_path: Path, server_factory, limit: str
) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=600, inp=1000)  # 2.4 MB of float32
    metrics_port = free_port()
    flags = {
        "--model": str(tmp_path / "init.spore"),
        "--rounds": str(ROUNDS),
        "--min-clients": str(N_CLIENTS),
        **ONE_SLOT[limit],
        "--round-timeout": "60",
        "--metrics-port": str(metrics_port),
    }
    # --keep-serving: /metrics is read after the job.
    args = [part for flag in flags.items() for part in flag]
    server = server_factory([*args, "--keep-serving"]).start()

    barrier = threading.Barrier(N_CLIENTS)
    results: dict[int, dict[str, np.ndarray] | None] = {}
    trained: dict[int, list[int]] = {i: [] for i in range(N_CLIENTS)}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            trained[i].append(config["round"])
            barrier.wait(30)  # everyone asks for an upload slot at once
            return local_step(i, weights), SAMPLES[i], {}

        client = Client(server.address, train=train, name=f"c{i}", poll_wait=1.0)
        try:
            results[i] = client.run()
        except BaseException as e:  # reported below, with the server's log
            errors.append(e)
        finally:
            client.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(60 - (time.monotonic() - t0), 1))
    elapsed = time.monotonic() - t0
    assert not any(t.is_alive() for t in threads), server.logs()[-5000:]
    assert not errors, errors

    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    accepted = metric(body, "sporenet_updates_accepted_total")
    print(f"{N_CLIENTS} clients x {ROUNDS} rounds in {elapsed:.1f} s: {accepted:g} accepted")
    # (c) every client trained once per round and its update was folded exactly once.
    assert all(rounds == list(range(1, ROUNDS + 1)) for rounds in trained.values()), trained
    assert accepted == N_CLIENTS * ROUNDS
    assert metric(body, "sporenet_updates_rejected_total") == 0
    assert metric(body, "sporenet_rounds_completed_total") == ROUNDS

    # (a) the published model is the direct NumPy FedAvg of the clients' updates.
    expected = expected_fedavg(w0, ROUNDS)
    for i in range(N_CLIENTS):
        final = results[i]
        assert final is not None
        for k in expected:
            np.testing.assert_allclose(final[k], expected[k], rtol=1e-5, atol=1e-6)

    assert server.terminate() == 0
    status = status_command(server.state_dir)
    assert status["job"]["status"] == "finished"
    assert status["model"]["version"] == ROUNDS
    fits = [r for r in status["rounds"] if r["phase"] == "fit"]
    assert [r["num_results"] for r in fits] == [N_CLIENTS] * ROUNDS
    assert [r["metrics"]["num_samples"] for r in fits] == [sum(SAMPLES)] * ROUNDS
