"""Static int8 quantization of Convs whose fused activation is not a clamp (SiLU, Sigmoid,
HardSwish, Tanh): the activation is split off again and runs as an int8 lookup table."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.converter.quantize import quantize_model
from sporenet.lite import Interpreter, parse
from sporenet.lite.ops import OpCode
from tests.unit.quantize.models import calibration, conv_act_conv

onnx = pytest.importorskip("onnx", reason="the converter needs the onnx extra")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ACTIVATIONS = {
    "silu": (OpCode.SILU, "silu"),
    "Sigmoid": (OpCode.SIGMOID, "sigmoid"),
    "HardSwish": (OpCode.HARD_SWISH, "hard_swish"),
    "Tanh": (OpCode.TANH, "tanh"),
}


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = np.sum((ref.astype(np.float64) - got) ** 2)
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / noise))


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_fused_lookup_activation_runs_as_an_int8_table(activation: str) -> None:
    op, fused_name = ACTIVATIONS[activation]
    float_model = convert_onnx(conv_act_conv(activation))
    float_nodes = parse(float_model).graphs[0].nodes
    assert [n.attrs.get("activation") for n in float_nodes] == [fused_name, None]
    result = quantize_model(float_model, mode="int8", calibration=calibration())
    assert result.report.float_ops == []
    model = parse(result.data)
    nodes = model.graphs[0].nodes
    ops = [n.op for n in nodes]
    assert ops == [OpCode.QUANTIZE, OpCode.CONV2D, op, OpCode.CONV2D, OpCode.DEQUANTIZE]
    table_op = nodes[2]
    assert model.tensors[table_op.inputs[0]].dtype == np.int8
    assert model.tensors[table_op.outputs[0]].dtype == np.int8
    x = calibration(16, seed=9)["x"]
    want = Interpreter(model_content=float_model).run({"x": x})["y"]
    got = Interpreter(model_content=result.data).run({"x": x})["y"]
    assert _sqnr(want, got) > 25.0


def test_dynamic_quantization_keeps_the_fused_silu() -> None:
    """Weight-only modes keep float activations, so the faster fused form stays."""
    result = quantize_model(convert_onnx(conv_act_conv("silu")), mode="dynamic")
    acts = [n.attrs.get("activation") for n in parse(result.data).graphs[0].nodes]
    assert "silu" in acts


def test_fused_leaky_relu_without_int8_kernel_stays_float_with_its_alpha() -> None:

    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.3),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8, 8])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    proto.ir_version = 8
    float_model = convert_onnx(proto)
    assert parse(float_model).graphs[0].nodes[0].attrs["activation"] == "leaky_relu"
    result = quantize_model(float_model, mode="int8", calibration=calibration())
    assert [(f.op, f.reason) for f in result.report.float_ops] == [("LEAKY_RELU", "no int8 kernel")]
    nodes = parse(result.data).graphs[0].nodes
    conv = next(n for n in nodes if n.op == OpCode.CONV2D)
    leaky = next(n for n in nodes if n.op == OpCode.LEAKY_RELU)
    assert "activation" not in conv.attrs and "alpha" not in conv.attrs
    assert leaky.attrs["alpha"] == pytest.approx(0.3)
    x = calibration(16, seed=3)["x"]
    want = Interpreter(model_content=float_model).run({"x": x})["y"]
    got = Interpreter(model_content=result.data).run({"x": x})["y"]
    assert _sqnr(want, got) > 25.0
