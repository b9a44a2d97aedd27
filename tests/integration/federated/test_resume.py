"""kill -9 of the daemon mid-round, restart on the same state dir: the round resumes."""

from __future__ import annotations

import collections
import json
import resource
import signal
import threading
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated import Client
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import make_model, wait_for

SAMPLES = [5, 10, 20, 40]


def local_step(i: int, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: (v * 0.5 + 0.1 * (i + 1)).astype(np.float32) for k, v in w.items()}


def expected(w0: dict[str, np.ndarray], rounds: int) -> dict[str, np.ndarray]:
    w = dict(w0)
    total = sum(SAMPLES)
    for _ in range(rounds):
        w = {
            k: (
                sum(n * local_step(i, w)[k].astype(np.float64) for i, n in enumerate(SAMPLES))
                / total
            ).astype(np.float32)
            for k in w
        }
    return w


def test_kill9_mid_round_then_restart_resumes_the_round(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=64, inp=32)
    args = [
        "--model",
        str(tmp_path / "init.spore"),
        "--rounds",
        "3",
        "--min-clients",
        "4",
        "--checkpoint-every",
        "2",
    ]
    server = server_factory(args).start()
    release = threading.Event()
    results: dict[int, dict[str, np.ndarray] | None] = {}

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            if i == 3 and config["round"] == 2:
                release.wait(60)  # the slow client is still training when the server dies
            return local_step(i, weights), SAMPLES[i], {}

        c = Client(server.address, train=train, name=f"c{i}", poll_wait=1.0, max_backoff=0.3)
        results[i] = c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()

    def round2_has_three_updates() -> bool:
        s = read_status(server.state_dir)
        accepted = [c for c, st in s["participants"].items() if st == "accepted"]
        return s["job"]["round"] == 2 and s["job"]["active"] and len(accepted) == 3

    wait_for(round2_has_three_updates, timeout=30, what="round 2 with three updates")
    server.kill9()
    # The three acknowledged updates are in the aggregate checkpoint: an upload is
    # answered only once a checkpoint holds it (group commit), so nothing is refolded.
    server.start()
    release.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()

    restored = server.events("aggregate_restored")
    assert restored and restored[0]["checkpointed"] == 3 and restored[0]["refolded"] == 0
    assert len(server.events("job_resumed")) == 1
    want = expected(w0, 3)
    for i in range(4):
        got = results[i]
        assert got is not None
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    status = read_status(server.state_dir)
    assert [r["num_results"] for r in status["rounds"]] == [4, 4, 4]
    assert server.terminate() == 0


def test_sigterm_mid_round_exits_zero_and_restart_finishes(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore")
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "2"]
    ).start()
    release = threading.Event()
    results: dict[int, dict[str, np.ndarray] | None] = {}

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            if i == 1:
                release.wait(60)
            return local_step(i, weights), SAMPLES[i], {}

        results[i] = Client(
            server.address, train=train, name=f"t{i}", poll_wait=5.0, max_backoff=0.3
        ).run()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    wait_for(
        lambda: "accepted" in read_status(server.state_dir)["participants"].values(),
        what="one accepted update",
    )
    # Client 0 is long-polling (a 5 s call) when SIGTERM arrives: the server still exits at once.
    assert server.terminate(timeout=8) == 0
    assert server.events("server_stopped")
    server.start()
    release.set()
    for t in threads:
        t.join(30)
    total = SAMPLES[0] + SAMPLES[1]
    want = {
        k: ((SAMPLES[0] * local_step(0, w0)[k] + SAMPLES[1] * local_step(1, w0)[k]) / total)
        for k in w0
    }
    for k in want:
        np.testing.assert_allclose(results[0][k], want[k], rtol=1e-5, atol=1e-6)  # type: ignore[index]


def _limit_file_size() -> None:
    # Writes past 320 KiB fail with EFBIG, as on a full disk (SIGXFSZ would kill instead).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (320 << 10, 320 << 10))


def test_kill9_between_fold_and_checkpoint_loses_none_and_folds_none_twice(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    # 205 KB of float32 weights fit under the file-size limit; the aggregate checkpoint
    # (float64 sums, 410 KB) does not: three updates are folded, none can be saved, so
    # none is acknowledged when the daemon is killed.
    w0 = make_model(tmp_path / "init.spore", out=128, inp=400)
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "4"]
    server = server_factory([*args, "--checkpoint-every", "100"])
    server.start(preexec_fn=_limit_file_size)
    release = threading.Event()
    results: dict[int, dict[str, np.ndarray] | None] = {}
    trained = collections.Counter[int]()

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            trained[i] += 1
            if i == 3:
                release.wait(60)  # holds the round open
            return local_step(i, weights), SAMPLES[i], {}

        c = Client(server.address, train=train, name=f"c{i}", poll_wait=1.0, max_backoff=0.3)
        results[i] = c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    with grpc.insecure_channel(server.address) as ch:
        stub = pb_grpc.FederatedStub(ch)

        def folded() -> int:
            status = json.loads(stub.GetStatus(pb.StatusRequest(), timeout=5).status_json)
            return int(status["participants"].get("accepted", 0))

        wait_for(lambda: folded() == 3, timeout=60, what="three updates folded")
    # The checkpoint was never written.
    assert not (server.state_dir / "rounds" / "r00001-fit.ckpt").exists()
    server.kill9()
    server.start()
    release.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), server.logs()

    restored = server.events("aggregate_restored")
    assert restored and restored[0]["checkpointed"] == 0 and restored[0]["refolded"] == 0
    # Those whose rows were saved before the failed checkpoint are asked again by name
    # (the store's own writes may have failed as well: then their rows were never saved).
    unsaved = {e["client"] for e in server.events("update_not_saved")}
    assert unsaved <= {"c0", "c1", "c2"}, server.logs()
    assert not server.events("kept_update_lost"), server.logs()
    # Each client trained once and sent its kept update again: all four count, once each.
    assert trained == {0: 1, 1: 1, 2: 1, 3: 1}, trained
    want = expected(w0, 1)
    for i in range(4):
        got = results[i]
        assert got is not None
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    assert [r["num_results"] for r in read_status(server.state_dir)["rounds"]] == [4]
    assert server.terminate() == 0
