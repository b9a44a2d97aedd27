"""The commands at the front door, run as real subprocesses: `--version`, help, the
`python -m` forms, a closed pipe, and the converter without onnx installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sporenet
from sporenet.lite import OpCode
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.console import EXIT_BROKEN_PIPE
from sporenet.lite.format import save

MODULES = {
    "sporenet-inspect": "sporenet.lite",
    "sporenet-convert": "sporenet.converter",
    "python -m sporenet.demo": "sporenet.demo",
    "python -m sporenet": "sporenet",
    "sporenet-server": "sporenet.federated.server",
    "sporenet-edge": "sporenet.federated.edge",
    "sporenet-client": "sporenet.federated.client",
    "sporenet-android-demo": "sporenet.android_demo",
    "sporenet-fleet": "sporenet.android_demo.fleet",
}
"""The module behind each command (console scripts are `main` of the same code)."""


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, **kwargs
    )  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    w = b.constant("fc.weight", np.ones((3, 4), np.float32))
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, w]), name="y")
    path = tmp_path_factory.mktemp("model") / "m.spore"
    save(b.build(), path)
    return path


@pytest.mark.parametrize("command", sorted(MODULES))
def test_version_and_help(command: str) -> None:
    version = run("-m", MODULES[command], "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.split()[-1] == sporenet.__version__
    help_ = run("-m", MODULES[command], "--help")
    assert help_.returncode == 0, help_.stderr
    assert "--version" in help_.stdout
    if command != "python -m sporenet":  # the overview runs nothing
        assert "--threads" in help_.stdout


def test_the_overview_lists_every_console_script() -> None:
    import tomllib

    scripts = tomllib.loads((Path(sporenet.__file__).parent / "pyproject.toml").read_text())[
        "project"
    ]["scripts"]
    out = run("-m", "sporenet").stdout
    missing = [name for name in scripts if name not in out]
    assert not missing, out
    assert "ONNX or TFLite" in out


def test_a_foreign_model_file_says_to_convert_it(tmp_path: Path) -> None:
    tflite = tmp_path / "model.tflite"
    tflite.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(32))
    out = run("-m", "sporenet.lite", str(tflite))
    assert out.returncode == 2
    assert "this is a TFLite model: convert it with `sporenet-convert" in out.stderr


def test_help_shows_defaults() -> None:
    out = run("-m", "sporenet.demo", "--help")
    assert "(default: 20)" in out.stdout  # --epochs
    assert "(default: None)" not in out.stdout


def test_package_overview_lists_the_commands() -> None:
    out = run("-m", "sporenet")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"sporenet {sporenet.__version__}")
    commands = ("sporenet-inspect", "sporenet-convert", "sporenet-server", "sporenet-edge")
    for command in (*commands, "sporenet.demo"):
        assert command in out.stdout


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run with stdout a pipe whose reader has already gone (as after `| head`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ("-m", "sporenet.converter", "--list-ops"),
        ("-m", "sporenet.lite", "MODEL"),
        ("-m", "sporenet"),
    ],
)
def test_a_closed_pipe_ends_the_command_quietly(
    args: tuple[str, ...],
    model_path: Path,
) -> None:
    out = _closed_pipe_run(*(str(model_path) if a == "MODEL" else a for a in args))
    assert out.stderr == b""
    assert out.returncode == EXIT_BROKEN_PIPE


def test_inspect_lists_the_model(model_path: Path) -> None:
    out = run("-m", "sporenet.lite", str(model_path))
    assert out.returncode == 0, out.stderr
    assert "FULLY_CONNECTED" in out.stdout and "fc.weight" in out.stdout


def test_converter_without_onnx_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "from sporenet.converter.cli import main\n"
        "sys.exit(main(sys.argv[1:]))"
    )
    out = run("-c", code, str(tmp_path / "m.onnx"))
    assert out.returncode == 1
    assert "pip install 'sporenet[onnx]'" in out.stderr
    assert "Traceback" not in out.stderr
