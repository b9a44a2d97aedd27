"""One daemon per state dir: a second server (or edge) on a state dir in use is refused
naming the holder, and `kill -9` of the holder leaves no stale lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.federated.helpers import free_port, make_model


def _second(kind: str, state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            f"sporenet.federated.{kind}",
            *("--address", f"127.0.0.1:{free_port()}", "--state-dir", str(state_dir)),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_daemon_on_a_state_dir_in_use_is_refused(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    first = server_factory(["--model", str(tmp_path / "init.spore"), "--rounds", "2"]).start()
    assert first.proc is not None
    for kind, args in (("server", ()), ("edge", ("--upstream", first.address))):
        out = _second(kind, first.state_dir, *args)
        assert out.returncode == 2, (kind, out.stderr)
        assert "is in use by another daemon" in out.stderr, out.stderr
        assert f"pid {first.proc.pid}" in out.stderr, out.stderr
    assert not first.events("job_resumed")  # the first is alone with its job
    first.kill9()  # the kernel drops the lock with the process: nothing stale is left
    first.start()
    assert first.events("job_resumed"), first.logs()
    assert first.terminate() == 0
