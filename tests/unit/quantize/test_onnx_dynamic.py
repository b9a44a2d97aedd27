"""Dynamically quantized ONNX models (onnxruntime's quantize_dynamic, and the int8 OCR
model the ddddocr package ships) imported and run against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime", reason="test extra")
quantization = pytest.importorskip("onnxruntime.quantization", reason="test extra")
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.converter import convert_onnx_model  # noqa: E402
from sporenet.lite import Interpreter  # noqa: E402
from sporenet.lite.format import serialize  # noqa: E402
from tests.packaged import packaged_file  # noqa: E402


def run_sporenet(
    path: Path, feeds: dict[str, np.ndarray], input_shapes: dict | None = None
) -> dict[str, np.ndarray]:
    model, _ = convert_onnx_model(path, input_shapes=input_shapes)
    return Interpreter(model_content=serialize(model)).run(feeds)


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _save(nodes: list, inputs: dict, output: str, inits: dict, path: Path) -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_conv_integer_is_exact_where_fast_convolutions_are_not(tmp_path: Path) -> None:
    """A 3x3 conv wide enough for Winograd: the int32 results must still be exact."""
    rng = np.random.default_rng(0)
    src = _save(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
        ],
        {"x": [1, 48, 16, 16]},
        "y",
        {"w": rng.normal(0, 0.1, (64, 48, 3, 3)), "w2": rng.normal(0, 0.1, (32, 64, 3, 3))},
        tmp_path / "conv.onnx",
    )
    out = tmp_path / "conv.dyn.onnx"
    for weight_type in (quantization.QuantType.QInt8, quantization.QuantType.QUInt8):
        quantization.quantize_dynamic(str(src), str(out), weight_type=weight_type)
        x = rng.normal(size=(1, 48, 16, 16)).astype(np.float32)
        got = run_sporenet(out, {"x": x})["y"]
        (want,) = run_ort(out, {"x": x})
        # Exact integer products; only float rounding of the rescaling may differ.
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_dynamic_quantize_lstm_matches_onnxruntime(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    hidden, inp = 16, 12
    src = _save(
        [
            helper.make_node(
                "LSTM",
                ["x", "W", "R", "B"],
                ["y", "h", "c"],
                hidden_size=hidden,
                direction="bidirectional",
            )
        ],
        {"x": [5, 2, inp]},
        "y",
        {
            "W": rng.normal(0, 0.3, (2, 4 * hidden, inp)),
            "R": rng.normal(0, 0.3, (2, 4 * hidden, hidden)),
            "B": rng.normal(0, 0.1, (2, 8 * hidden)),
        },
        tmp_path / "lstm.onnx",
    )
    out = tmp_path / "lstm.dyn.onnx"
    quantization.quantize_dynamic(
        str(src), str(out), op_types_to_quantize=["LSTM"], weight_type=quantization.QuantType.QInt8
    )
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(str(out)).graph.node}
    x = rng.normal(size=(5, 2, inp)).astype(np.float32)
    got = run_sporenet(out, {"x": x})["y"]
    (want,) = run_ort(out, {"x": x})[:1]
    # Inputs and states are requantized at every step as onnxruntime does: the outputs
    # agree to float rounding, and a flipped rounding of one state value stays small.
    assert np.abs(got - want).max() < 2e-3


def _ddddocr_model() -> Path | None:
    return packaged_file("ddddocr", "common_old.onnx")


@pytest.mark.slow
@pytest.mark.skipif(
    _ddddocr_model() is None,
    reason="the ddddocr package (76 MB, not in the test extra) is not installed",
)
def test_ddddocr_int8_ocr_model_matches_onnxruntime() -> None:
    """ddddocr's common_old.onnx: ConvInteger, DynamicQuantizeLinear, DynamicQuantizeLSTM."""
    path = _ddddocr_model()
    assert path is not None
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"ConvInteger", "DynamicQuantizeLinear", "DynamicQuantizeLSTM"} <= ops
    name = onnx.load(str(path)).graph.input[0].name
    x = np.random.default_rng(0).uniform(0, 1, (1, 1, 64, 200)).astype(np.float32)
    got = next(iter(run_sporenet(path, {name: x}, {name: (1, 1, 64, 200)}).values()))
    (want,) = run_ort(path, {name: x})
    assert got.shape == want.shape
    assert np.array_equal(got.argmax(-1), want.argmax(-1))  # the same characters
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()
