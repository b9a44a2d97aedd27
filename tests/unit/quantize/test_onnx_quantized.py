"""Quantized ONNX models from onnxruntime's quantizer, imported and run against onnxruntime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.quantize.models import calibration, cnn, mixed

ort = pytest.importorskip("onnxruntime", reason="test extra")
quantization = pytest.importorskip("onnxruntime.quantization", reason="test extra")
import onnx  # noqa: E402

from sporenet.converter import convert_onnx_model  # noqa: E402
from sporenet.lite import Interpreter  # noqa: E402
from sporenet.lite.format import serialize  # noqa: E402
from sporenet.lite.ops import OpCode  # noqa: E402
from tests.references import EXACT_INT8_WEIGHT, run_ort_reference  # noqa: E402


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, x: np.ndarray) -> None:
        self.it = iter([{"x": x[i : i + 1]} for i in range(len(x))])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)


def _run_sporenet(path: Path, x: np.ndarray) -> np.ndarray:
    model, _ = convert_onnx_model(path)
    return Interpreter(model_content=serialize(model)).run({"x": x})["y"]


def _run_ort(path: Path, x: np.ndarray) -> np.ndarray:
    """onnxruntime's output with graph optimizations off (tests/references.py): a QDQ
    model's float ops stay float, a QOperator model's QLinear kernels run as written."""
    return run_ort_reference(path, {"x": x})[0]


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.fixture(scope="module")
def float_path(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("q") / "cnn.onnx"
    onnx.save(cnn(), str(path))
    return path


def _output_step(path: Path) -> float:
    """The quantization step of the model's output: the scale of the DequantizeLinear
    that produces it (or of a QGemm's output)."""
    model = onnx.load(str(path))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    output = model.graph.output[0].name
    producer = next(n for n in model.graph.node if output in n.output)
    if producer.op_type == "DequantizeLinear":
        return float(inits[producer.input[1]])
    if producer.op_type == "QGemm":
        return float(inits[producer.input[7]])
    raise AssertionError(f"the output comes from {producer.op_type}")


def _quantize(src: Path, out: Path, fmt: str, activations: str, x: np.ndarray) -> None:
    """onnxruntime's static quantization, int8 weights per channel. QOperator models get
    7-bit weights (reduce_range): the reference runs their QLinear nodes on onnxruntime's
    int8 kernels, exact on every CPU only then (tests/references.py)."""
    quantization.quantize_static(
        str(src),
        str(out),
        _Reader(x),
        quant_format=getattr(quantization.QuantFormat, fmt),
        activation_type=getattr(quantization.QuantType, activations),
        weight_type=quantization.QuantType.QInt8,
        per_channel=True,
        reduce_range=fmt == "QOperator",
    )
    if fmt == "QOperator":
        model = onnx.load(str(out))
        int8 = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
        widest = max(np.abs(onnx.numpy_helper.to_array(t).astype(np.int64)).max() for t in int8)
        assert widest <= EXACT_INT8_WEIGHT, widest


FORMATS = [("QDQ", "QInt8"), ("QOperator", "QUInt8"), ("QDQ", "QUInt8")]


@pytest.mark.parametrize(("fmt", "activations"), FORMATS)
def test_quantized_models_fold_into_integer_kernels_within_one_step(
    tmp_path: Path, fmt: str, activations: str
) -> None:
    """Conv, residual Add, Sigmoid, Concat, GlobalAveragePool, MatMul, Softmax: onnxruntime's
    quantized model runs on sporenet's int8 kernels from the first QUANTIZE to the last
    DEQUANTIZE, within one output step of onnxruntime's result."""
    src, out = tmp_path / "mixed.onnx", tmp_path / f"mixed.{fmt}.onnx"
    onnx.save(mixed(), str(src))
    rng = np.random.default_rng(0)
    _quantize(src, out, fmt, activations, rng.standard_normal((32, 3, 8, 8)).astype(np.float32))
    model, report = convert_onnx_model(out)
    ops = [n.op for n in model.graphs[0].nodes]
    assert ops.count(OpCode.QUANTIZE) == 1 and ops.count(OpCode.DEQUANTIZE) == 1, ops
    assert report.passes["qdq-folding"] >= 10
    assert model.tensors[model.graphs[0].nodes[1].inputs[0]].dtype == (
        np.int8 if activations == "QInt8" else np.uint8
    )
    x = rng.standard_normal((64, 3, 8, 8)).astype(np.float32)
    got = Interpreter(model_content=serialize(model)).run({"x": x})["y"]
    want = _run_ort(out, x)
    within = np.mean(np.abs(got - want) <= _output_step(out) * 1.0001)
    assert within >= 0.999, within


@pytest.mark.parametrize(("fmt", "activations"), [("QDQ", "QInt8"), ("QOperator", "QUInt8")])
def test_quantize_static_models_match_onnxruntime_within_one_step(
    float_path: Path, tmp_path: Path, fmt: str, activations: str
) -> None:
    out = tmp_path / f"cnn.{fmt}.onnx"
    _quantize(float_path, out, fmt, activations, calibration(32)["x"])
    ops = _ops(out)
    assert (
        ("QuantizeLinear" in ops and "DequantizeLinear" in ops)
        if fmt == "QDQ"
        else ("QLinearConv" in ops)
    )
    x = calibration(64, seed=5)["x"]
    got, want = _run_sporenet(out, x), _run_ort(out, x)
    step = _output_step(out)
    within = np.mean(np.abs(got - want) <= step * 1.0001)
    assert within >= 0.999, (within, np.abs(got - want).max(), step)


def test_quantize_dynamic_model_matches_onnxruntime(float_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "cnn.dynamic.onnx"
    quantization.quantize_dynamic(
        str(float_path), str(out), weight_type=quantization.QuantType.QInt8, reduce_range=True
    )  # 7-bit weights: onnxruntime's ConvInteger and MatMulInteger exact on every CPU
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= _ops(out)
    x = calibration(16, seed=6)["x"]
    got, want = _run_sporenet(out, x), _run_ort(out, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_quantized_weights_stay_int8_in_the_file(float_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "cnn.qdq.onnx"
    quantization.quantize_static(
        str(float_path),
        str(out),
        _Reader(calibration(8)["x"]),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=True,
    )
    model, _ = convert_onnx_model(out, optimize=False)
    weights = [t for t in model.tensors if t.quantization is not None and t.data is not None]
    assert all(t.data.dtype == np.int8 for t in weights)
    convs = sorted(t.quantization.scale.size for t in weights if t.data.ndim == 4)
    assert convs == [8, 16]  # per output channel of both convolutions


@pytest.mark.parametrize(("fmt", "activations"), [("QDQ", "QInt8"), ("QOperator", "QUInt8")])
def test_imported_quantized_models_use_onnxruntime_rounding_and_are_bit_exact(
    float_path: Path, tmp_path: Path, fmt: str, activations: str
) -> None:
    """The importer marks the integer nodes rounding="onnx"; on a net onnxruntime runs
    entirely with QLinear kernels (Conv, Relu, MaxPool, Gemm) the outputs are equal."""
    out = tmp_path / f"cnn.{fmt}.onnx"
    _quantize(float_path, out, fmt, activations, calibration(32)["x"])
    model, _ = convert_onnx_model(out)
    nodes = model.graphs[0].nodes
    integer = [n for n in nodes if model.tensors[n.inputs[0]].dtype in (np.int8, np.uint8)]
    assert len(integer) >= 5 and all(n.attrs.get("rounding") == "onnx" for n in integer)
    assert all(n.attrs.get("rounding") == "onnx" for n in nodes if n.op == OpCode.QUANTIZE)
    floats = [
        n for n in nodes if n.op != OpCode.QUANTIZE and model.tensors[n.inputs[0]].dtype.kind == "f"
    ]
    assert all("rounding" not in n.attrs for n in floats)
    x = calibration(64, seed=5)["x"]
    got = Interpreter(model_content=serialize(model)).run({"x": x})["y"]
    np.testing.assert_array_equal(got, _run_ort(out, x))
    unfolded, _ = convert_onnx_model(out, optimize=False)  # QUANTIZE as QuantizeLinear
    quantizers = [n for n in unfolded.graphs[0].nodes if n.op == OpCode.QUANTIZE]
    assert quantizers and all(n.attrs.get("rounding") == "onnx" for n in quantizers)
