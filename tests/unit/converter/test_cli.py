"""sporenet-convert as users run it: a real subprocess, real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sporenet.lite import Interpreter, load
from tests.unit.converter.helpers import helper, make_model, onnx, run_ort


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sporenet.converter.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def cnn_path(tmp_path: Path) -> Path:
    """A small CNN with the patterns the passes rewrite (BN, ReLU, Dropout, Flatten, Gemm)."""
    rng = np.random.default_rng(3)

    def r(*s: int) -> np.ndarray:
        return rng.standard_normal(s).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "m", "v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Dropout", ["p1"], ["d1"]),
        helper.make_node("Flatten", ["d1"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    inits = {
        "w1": r(8, 3, 3, 3),
        "b1": r(8),
        "g": r(8),
        "be": r(8),
        "m": r(8),
        "v": np.abs(r(8)) + 0.5,
        "w2": r(10, 8 * 4 * 4),
        "b2": r(10),
    }
    model = make_model(nodes, {"x": ["batch", 3, 8, 8]}, ["probs"], initializers=inits, opset=13)
    path = tmp_path / "cnn.onnx"
    onnx.save(model, path)
    return path


def test_convert_prints_a_report_and_writes_a_working_model(cnn_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "cnn.spore"
    result = cli(cnn_path, "-o", out, "--metadata", "labels=a,b", "--metadata", "owner=me")
    assert result.returncode == 0, result.stderr
    report = result.stdout
    for field in (
        "nodes",
        "parameters",
        "size",
        "passes",
        "time",
        "batchnorm-folding",
        "BATCH_NORM",
    ):
        assert field in report, field
    assert len(report.splitlines()) <= 25  # one screen
    model = load(out)
    assert model.metadata["labels"] == "a,b" and model.metadata["owner"] == "me"
    ops = [n.op.name for n in model.graphs[0].nodes]
    assert "BATCH_NORM" not in ops and "RELU" not in ops  # folded and fused
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = run_ort(onnx.load(cnn_path), {"x": x})[0]
    got = Interpreter(model_path=out).run({"x": x})["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_optimized_and_unoptimized_outputs_agree(cnn_path: Path, tmp_path: Path) -> None:
    fast, plain = tmp_path / "fast.spore", tmp_path / "plain.spore"
    assert cli(cnn_path, "-o", fast).returncode == 0
    result = cli(cnn_path, "-o", plain, "--no-optimize")
    assert result.returncode == 0, result.stderr
    assert "none (--no-optimize)" in result.stdout
    x = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
    a = Interpreter(model_path=fast).run({"x": x})["probs"]
    b = Interpreter(model_path=plain).run({"x": x})["probs"]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert len(load(fast).graphs[0].nodes) < len(load(plain).graphs[0].nodes)


def test_input_shape_fixes_dynamic_dimensions(cnn_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "fixed.spore"
    result = cli(cnn_path, "-o", out, "--input-shape", "x:4,3,8,8")
    assert result.returncode == 0, result.stderr
    model = load(out)
    assert model.tensors[model.graphs[0].inputs[0]].shape == (4, 3, 8, 8)


def test_list_ops(tmp_path: Path) -> None:
    result = cli("--list-ops")
    assert result.returncode == 0
    ops = result.stdout.split()
    assert {"Conv", "Gemm", "Relu", "BatchNormalization", "Reshape"} <= set(ops)
    assert ops == sorted(ops)


@pytest.mark.parametrize(
    "case", ["garbage", "truncated", "unsupported", "bad-shape", "bad-metadata", "missing"]
)
def test_failures_exit_nonzero_with_a_message_and_no_output(
    case: str, cnn_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.spore"
    args: list[str | Path] = [cnn_path, "-o", out]
    if case == "garbage":
        bad = tmp_path / "garbage.onnx"
        bad.write_bytes(b"\x00\x01not an onnx model at all" * 50)
        args[0] = bad
    elif case == "truncated":
        bad = tmp_path / "truncated.onnx"
        data = cnn_path.read_bytes()
        bad.write_bytes(data[: len(data) - 100])
        args[0] = bad
    elif case == "unsupported":
        bad = tmp_path / "sin.onnx"
        onnx.save(make_model([helper.make_node("Sin", ["x"], ["y"])], {"x": [2]}, ["y"]), bad)
        args[0] = bad
    elif case == "bad-shape":
        args += ["--input-shape", "x:1,a,b"]
    elif case == "bad-metadata":
        args += ["--metadata", "novalue"]
    else:
        args[0] = tmp_path / "absent.onnx"
    result = cli(*args)
    assert result.returncode != 0
    assert result.stderr.startswith("sporenet-convert: error:"), result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.spore.tmp*"))
    if case == "unsupported":
        assert "Sin (x1)" in result.stderr and "--list-ops" in result.stderr


def test_existing_output_survives_a_failed_conversion(tmp_path: Path) -> None:
    out = tmp_path / "keep.spore"
    out.write_bytes(b"previous")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk" * 10)
    assert cli(bad, "-o", out).returncode != 0
    assert out.read_bytes() == b"previous"


def test_console_script_points_at_main() -> None:
    import importlib
    import tomllib

    root = Path(__file__).resolve().parents[3]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["sporenet-convert"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_verbose_lists_every_op(cnn_path: Path, tmp_path: Path) -> None:
    result = cli(cnn_path, "-o", tmp_path / "v.spore", "--verbose")
    assert result.returncode == 0, result.stderr
    assert "more (--verbose shows all)" not in result.stdout
    assert "ONNX ops   : BatchNormalization x1" in result.stdout


def test_parameter_count_follows_the_passes(cnn_path: Path) -> None:
    from sporenet.converter import convert_onnx_model

    _, plain = convert_onnx_model(cnn_path, optimize=False)
    _, fast = convert_onnx_model(cnn_path)
    conv, bn, fc = 8 * 3 * 3 * 3 + 8, 4 * 8, 10 * 128 + 10
    assert plain.parameters == conv + bn + fc
    assert fast.parameters == conv + fc  # BatchNorm folded into the convolution
