"""Ctrl-C (SIGINT) ends the long-running commands with a line, not a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.format import save
from tests.integration.federated.helpers import free_port as closed_port


def digits_like(path: Path) -> Path:
    """A tiny model the app and the fleet accept: 64 inputs -> FullyConnected -> logits."""
    b = ModelBuilder()
    x = b.input("input", (-1, 64))
    w = b.constant("head.weight", np.zeros((10, 64), np.float32))
    bias = b.constant("head.bias", np.zeros(10, np.float32))
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, w, bias]), name="logits")
    save(b.build(), path)
    return path


def _default_sigint() -> None:
    """In the child before exec: SIGINT as a terminal gives it. A job started in the
    background of a non-interactive shell (as CI may run the suite) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_after_first_line(command: list[str], cwd: Path) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [sys.executable, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        preexec_fn=_default_sigint,
    )
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, first + out, err


@pytest.mark.parametrize(
    "which",
    [
        "fleet",
        "app",
        # the demo imports and starts training first: long for the default run
        pytest.param("demo", marks=pytest.mark.slow),
    ],
)
def test_ctrl_c_ends_quietly(which: str, tmp_path: Path) -> None:
    model = digits_like(tmp_path / "m.spore")
    commands = {
        "fleet": (
            [
                "-m",
                "sporenet.android_demo.fleet",
                "--model",
                str(model),
                "--devices",
                "1",
                "--rounds",
                "1",
                "--server",
                f"127.0.0.1:{closed_port()}",
                "--connect-timeout",
                "600",
            ],
            130,
        ),
        "app": (
            [
                "-m",
                "sporenet.android_demo",
                "--model",
                str(model),
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                "0",
            ],
            0,
        ),
        "demo": (["-m", "sporenet.demo", "--epochs", "50", "--out", str(tmp_path / "d")], 130),
    }
    command, expected = commands[which]
    code, out, err = interrupt_after_first_line(command, tmp_path)
    assert "Traceback" not in err, err
    assert code == expected, out + err
    assert out.strip()  # it had said something before it was stopped
