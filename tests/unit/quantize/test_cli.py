"""sporenet-convert --quantize as users run it: a real subprocess, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.unit.quantize.models import calibration, cnn

onnx = pytest.importorskip("onnx", reason="the converter needs the onnx extra")

from sporenet.lite import Interpreter  # noqa: E402


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sporenet.converter.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    onnx.save(cnn(), str(root / "cnn.onnx"))
    np.savez(root / "calib.npz", **calibration(32))
    return root


def test_onnx_to_int8_with_report(files: Path) -> None:
    out, report = files / "cnn.int8.spore", files / "report.json"
    done = cli(
        files / "cnn.onnx",
        "-o",
        out,
        "--quantize",
        "int8",
        "--calibration",
        files / "calib.npz",
        "--calibration-method",
        "entropy",
        "--report",
        report,
    )
    assert done.returncode == 0, done.stderr
    assert "quantized  : int8, entropy calibration on 32 samples" in done.stdout
    assert "worst" in done.stdout
    data = json.loads(report.read_text())
    assert data["mode"] == "int8" and data["samples"] == 32
    assert {t["name"] for t in data["tensors"]} >= {"r1", "y"}
    x = calibration(4, seed=9)["x"]
    y = Interpreter(model_path=out).run({"x": x})["y"]
    assert y.shape == (4, 10) and np.all(np.isfinite(y))


def test_spore_input_is_quantized_in_one_command(files: Path) -> None:
    spore = files / "cnn.spore"
    assert cli(files / "cnn.onnx", "-o", spore).returncode == 0
    done = cli(
        spore,
        "-o",
        files / "cnn.u8.spore",
        "--quantize",
        "uint8",
        "--per-tensor",
        "--calibration",
        files / "calib.npz",
    )
    assert done.returncode == 0, done.stderr
    assert "per-tensor weights" in done.stdout
    again = cli(spore, "-o", files / "same.spore")
    assert again.returncode == 1 and "give --quantize" in again.stderr


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"image": np.zeros((2, 1, 8, 8), np.float32)}, "missing ['x'], unknown ['image']"),
        ({"x": np.zeros((2, 3, 8, 8), np.float32)}, "expected samples of shape (N, 1, 8, 8)"),
        ({"x": np.zeros((2, 1, 8, 8), np.int32)}, "expected dtype float32, found int32"),
        ({"x": np.zeros((0, 1, 8, 8), np.float32)}, "expected at least 1 sample(s), found 0"),
    ],
)
def test_bad_calibration_exits_1_naming_the_input(
    files: Path, tmp_path: Path, arrays: dict, message: str
) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    out = tmp_path / "out.spore"
    done = cli(
        files / "cnn.onnx", "-o", out, "--quantize", "int8", "--calibration", tmp_path / "bad.npz"
    )
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert not out.exists()


def test_usage_errors(files: Path, tmp_path: Path) -> None:
    done = cli(files / "cnn.onnx", "-o", tmp_path / "o.spore", "--calibration", files / "calib.npz")
    assert done.returncode == 2 and "need --quantize" in done.stderr
    done = cli(files / "cnn.onnx", "-o", tmp_path / "o.spore", "--quantize", "int8")
    assert done.returncode == 1 and "needs calibration data" in done.stderr
    done = cli(files / "cnn.onnx", "-o", tmp_path / "o.spore", "--quantize", "int4")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_unwritable_report_is_an_error(files: Path, tmp_path: Path) -> None:
    done = cli(
        files / "cnn.onnx",
        "-o",
        tmp_path / "o.spore",
        "--quantize",
        "fp16",
        "--report",
        tmp_path / "missing" / "r.json",
    )
    assert done.returncode == 1 and "cannot write the report" in done.stderr
