"""The `sporenet-server` command line: version, help, `python -m`, a closed pipe."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sporenet import __version__
from sporenet.federated.server.cli import _run_parser, main
from sporenet.federated.server.state import Store


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"sporenet-server {__version__}"


def test_help_shows_the_status_subcommand_defaults_and_explains_every_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "status --state-dir DIR" in text
    assert "(default: 3)" in text and "(default: fedavg)" in text
    unexplained = [a.option_strings for a in _run_parser()._actions if not a.help]
    assert unexplained == []


def test_python_m_runs_the_cli_and_a_missing_state_dir_is_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sporenet.federated.server", "status", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "holds no sporenet-server state" in done.stderr


class _ClosedPipe(io.StringIO):
    """A stdout whose reader has gone, as `sporenet-server ... | head` leaves it."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        return self._fd

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd


def test_output_to_a_closed_pipe_ends_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store(tmp_path / "state.db").close()  # an empty job: status has something to print
    fd = os.open(tmp_path / "stdout", os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe(fd))
    try:
        assert main(["status", "--state-dir", str(tmp_path)]) == 1
    finally:
        os.close(fd)


def test_a_port_in_use_is_refused_before_the_state_dir_exists(tmp_path: Path) -> None:
    import socket

    from tests.integration.federated.helpers import make_model

    make_model(tmp_path / "init.spore")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sporenet.federated.server",
                "--model",
                str(tmp_path / "init.spore"),
                "--state-dir",
                str(tmp_path / "state"),
                "--address",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: it is in use" in done.stderr
    assert "E0000" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "state").exists()
