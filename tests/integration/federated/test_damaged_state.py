"""A damaged state dir: the daemon refuses to start (exit 2, naming what is wrong) or
recovers exactly; it never serves damaged bytes or starts the job over."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.common.codec import encode_update
from sporenet.federated.server.phase_files import PhaseFiles
from sporenet.federated.server.status import read_status
from tests.integration.federated.helpers import make_model, wait_for


def _start_fails(state_dir: Path, model: Path) -> str:
    """Run the daemon on `state_dir`; assert it exits 2; its stderr."""
    cmd = [sys.executable, "-m", "sporenet.federated.server", "--address", "127.0.0.1:0"]
    out = subprocess.run(
        [*cmd, "--state-dir", str(state_dir), "--model", str(model), "--min-clients", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return out.stderr


def _job_dir(tmp_path: Path, server_factory, *, kill: bool) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """A state dir whose job was created, then the daemon killed with -9 (its WAL not
    merged into state.db) or stopped with SIGTERM (merged)."""
    make_model(tmp_path / "init.spore")
    server = server_factory(["--model", str(tmp_path / "init.spore"), "--min-clients", "2"])
    server.start()
    if kill:
        server.kill9()
    else:
        assert server.terminate() == 0
    return server.state_dir, tmp_path / "init.spore"


@pytest.fixture
def job_dir(tmp_path: Path, server_factory) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    return _job_dir(tmp_path, server_factory, kill=True)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


MODEL_DAMAGE = {
    "flipped": _flip,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-10]),
    "garbage": lambda p: p.write_bytes(os.urandom(p.stat().st_size)),
    "missing": lambda p: p.unlink(),
}


@pytest.mark.parametrize("damage", sorted(MODEL_DAMAGE))
def test_damaged_model_version_is_refused_naming_the_file(job_dir, damage: str) -> None:  # type: ignore[no-untyped-def]
    state_dir, model = job_dir
    MODEL_DAMAGE[damage](state_dir / "models" / "v00000.spore")
    err = _start_fails(state_dir, model)
    assert "v00000.spore" in err and "model version 0" in err, err


DB_DAMAGE = {
    "zeroed db": lambda d: (d / "state.db").write_bytes(bytes((d / "state.db").stat().st_size)),
    "truncated db": lambda d: (d / "state.db").write_bytes((d / "state.db").read_bytes()[:100]),
    "deleted db": lambda d: [(d / n).unlink(missing_ok=True) for n in ("state.db", "state.db-wal")],
    "deleted wal": lambda d: (d / "state.db-wal").unlink(),
    "garbage wal": lambda d: (d / "state.db-wal").write_bytes(os.urandom(8192)),
}


@pytest.mark.parametrize("damage", sorted(DB_DAMAGE))
def test_damaged_database_refuses_instead_of_starting_over(
    tmp_path: Path, server_factory, damage: str
) -> None:  # type: ignore[no-untyped-def]
    # The database faults on a cleanly stopped daemon (all in state.db), the WAL faults
    # after a kill -9 (the job only in state.db-wal).
    state_dir, model = _job_dir(tmp_path, server_factory, kill="wal" in damage)
    before = (state_dir / "models" / "v00000.spore").read_bytes()
    DB_DAMAGE[damage](state_dir)
    err = _start_fails(state_dir, model)
    assert "is damaged" in err and "state.db" in err and "backup" in err, err
    assert (state_dir / "models" / "v00000.spore").read_bytes() == before


def test_state_dir_that_is_a_file_or_cannot_be_created_is_refused(tmp_path: Path) -> None:
    make_model(tmp_path / "init.spore")
    (tmp_path / "state").write_text("not a directory")
    err = _start_fails(tmp_path / "state", tmp_path / "init.spore")
    assert "is not a directory" in err, err
    # Below a file: the directory cannot be created (the tests run as root, for whom
    # permission bits do not make a directory read-only).
    err = _start_fails(tmp_path / "state" / "sub", tmp_path / "init.spore")
    assert "is not writable" in err and "Not a directory" in err, err


def _step(i: int, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: (v * 0.5 + 0.25 * (i + 1)).astype(np.float32) for k, v in w.items()}


def _mid_round(tmp_path: Path, server_factory, checkpoint_every: int):  # type: ignore[no-untyped-def]
    """A 1-round job of 2 clients killed with -9 once client 0's update is accepted; the
    clients (threads) and a release event for client 1."""
    w0 = make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "2"]
    server = server_factory([*args, "--checkpoint-every", str(checkpoint_every)]).start()
    release, results = threading.Event(), {}
    stop = threading.Event()  # set by a test whose server does not come back

    def run(i: int) -> None:
        def train(weights: dict, config: dict) -> tuple:
            if i == 1:
                release.wait(120)
            return _step(i, weights), 10 * (i + 1), {}

        c = Client(server.address, train=train, name=f"c{i}", poll_wait=1.0, max_backoff=0.3)
        results[i] = c.run(stop)
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()

    def one_accepted() -> bool:
        s = read_status(server.state_dir)
        return list(s["participants"].values()).count("accepted") == 1

    wait_for(one_accepted, timeout=60, what="client 0's update accepted")
    server.kill9()
    return server, w0, threads, release, results, stop


def test_damaged_kept_update_is_asked_for_again_and_the_model_is_exact(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    server, w0, threads, release, results, _ = _mid_round(tmp_path, server_factory, 100)
    _as_journalled(server.state_dir, w0, damaged=True)
    server.start()
    release.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()
    lost = server.events("kept_update_lost")
    assert len(lost) == 1 and lost[0]["client"] == "c0", server.logs()
    want = {k: ((10 * _step(0, w0)[k].astype(np.float64) + 20 * _step(1, w0)[k]) / 30) for k in w0}
    for k in w0:
        np.testing.assert_allclose(results[0][k], want[k], rtol=1e-6, atol=1e-6)


def test_a_journal_of_the_previous_build_is_refolded_exactly(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    server, w0, threads, release, results, _ = _mid_round(tmp_path, server_factory, 100)
    _as_journalled(server.state_dir, w0, damaged=False)
    server.start()
    release.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()
    restored = server.events("aggregate_restored")
    assert restored and restored[0]["refolded"] == 1, server.logs()
    assert not server.events("kept_update_lost"), server.logs()
    want = {k: ((10 * _step(0, w0)[k].astype(np.float64) + 20 * _step(1, w0)[k]) / 30) for k in w0}
    for k in w0:
        np.testing.assert_allclose(results[0][k], want[k], rtol=1e-6, atol=1e-6)


def _as_journalled(state_dir: Path, w0: dict, *, damaged: bool) -> None:
    """Make the killed round's state dir what the build before group commit left: client
    0's accepted update in the phase's journal (flipped when `damaged`), no checkpoint."""
    (state_dir / "rounds" / "r00001-fit.ckpt").unlink()
    files = PhaseFiles(state_dir, 1, "fit")
    payload = memoryview(encode_update({k: _step(0, w0)[k] - w0[k] for k in w0}))
    files.append("c0", payload, num_samples=10)
    files.close()
    if damaged:
        _flip(files.journal_path)


def test_damaged_checkpoint_is_refused_naming_the_file(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    server, _, threads, release, _, stop = _mid_round(tmp_path, server_factory, 1)
    ckpt = server.state_dir / "rounds" / "r00001-fit.ckpt"
    _flip(ckpt)
    err = _start_fails(server.state_dir, tmp_path / "init.spore")
    assert "r00001-fit.ckpt" in err and "CRC-32" in err, err
    stop.set()  # the server stays down: its clients stop instead of retrying
    release.set()
    for t in threads:
        t.join(30)
