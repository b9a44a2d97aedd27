"""The int8 kernels' rounding="onnx" mode is bit-exact with onnxruntime's QLinear ops.

onnxruntime requantizes in float (MLAS: float32(acc + bias) * float32 multiplier, round
half to even, + zero point, saturate); the "onnx" mode reproduces it, so every element
must be equal, not merely within one step as with the default "tflite" mode.

Convolutions and matrix products are checked against the exact integer reference of that
arithmetic (quantized_onnx.py) on full-range int8 weights, and the reference against
onnxruntime on 7-bit weights, where onnxruntime's int8 kernels are exact on every CPU
(tests/references.py). The other ops run in onnxruntime as written (no graph
optimizations), float ops between DequantizeLinear and QuantizeLinear.
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.errors import LiteError
from sporenet.lite.ops import OpCode
from tests.references import EXACT_INT8_WEIGHT
from tests.unit.lite.onnx_reference import run_onnx_graph, run_onnx_op
from tests.unit.lite.quantized_onnx import (
    multipliers,
    qlinear_conv,
    qlinear_conv_reference,
    qlinear_matmul,
    qlinear_matmul_reference,
    requantize_onnx,
)
from tests.unit.lite.quantized_reference import quant, random_q, run_one_op


def _conv_case(rng, xdtype, group, stride, o, c, size, per_channel, bias_range):
    x = random_q(rng, (1, c, size, size), xdtype)
    w = rng.integers(-127, 128, (o, c // group, 3, 3)).astype(np.int8)
    sx = np.float32(rng.uniform(0.005, 0.05))
    zx = np.uint8(rng.integers(90, 160)) if xdtype == np.uint8 else np.int8(rng.integers(-20, 20))
    n_scales = o if per_channel else 1
    sw = rng.uniform(0.001, 0.01, n_scales).astype(np.float32)
    # A small output scale puts many accumulators on and around ties.
    so = np.float32(rng.uniform(0.02, 0.2))
    zo = np.uint8(rng.integers(100, 150)) if xdtype == np.uint8 else np.int8(rng.integers(-9, 9))
    bias = rng.integers(-bias_range, bias_range, o).astype(np.int32)
    return x, w, sx, zx, sw, so, zo, bias


@pytest.mark.parametrize("xdtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    "group, stride, o, c, per_channel",
    [
        (1, 1, 8, 6, True),
        (1, 2, 8, 6, False),
        (2, 1, 8, 6, True),
        (16, 1, 16, 16, True),
        (1, 1, 32, 160, True),
    ],
)
def test_conv_is_bit_exact_with_qlinearconv(xdtype, group, stride, o, c, per_channel):
    rng = np.random.default_rng(group * 100 + stride * 10 + c)
    x, w, sx, zx, sw, so, zo, bias = _conv_case(
        rng, xdtype, group, stride, o, c, 9, per_channel, 20000
    )
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride], "group": group}
    case = (x, sx, zx, w, sw, so, zo, bias, attrs)
    got, want = qlinear_conv(*case, rounding="onnx")
    np.testing.assert_array_equal(got, want)
    # The default mode is TFLite's: it differs from onnxruntime somewhere on such layers.
    tfl, _ = qlinear_conv(*case)
    assert np.abs(tfl.astype(np.int64) - want.astype(np.int64)).max() <= 1


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_matmul_is_bit_exact_with_qlinearmatmul(dtype):
    got, want = qlinear_matmul(dtype, 12, 0.05, rounding="onnx")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xdtype", [np.uint8, np.int8])
@pytest.mark.parametrize("group, stride, per_channel", [(1, 1, True), (2, 2, False)])
def test_integer_reference_is_onnxruntimes_qlinearconv(xdtype, group, stride, per_channel):
    """The exact reference equals onnxruntime's QLinearConv on 7-bit weights, on ties too."""
    rng = np.random.default_rng(group * 7 + stride)
    x, w, sx, zx, sw, so, zo, bias = _conv_case(
        rng, xdtype, group, stride, 8, 6, 9, per_channel, 20000
    )
    w = np.clip(w, -EXACT_INT8_WEIGHT, EXACT_INT8_WEIGHT).astype(np.int8)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride], "group": group}
    (want,) = run_onnx_op(
        "QLinearConv",
        [x, sx, zx, w, sw, np.zeros(sw.size, np.int8), so, zo, bias],
        initializers=range(1, 9),
        kernel_shape=[3, 3],
        **attrs,
    )
    got = qlinear_conv_reference(x, sx, zx, w, sw, so, zo, bias, attrs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_integer_reference_is_onnxruntimes_qlinearmatmul(dtype):
    rng = np.random.default_rng(16)
    lo = 0 if dtype == np.uint8 else -EXACT_INT8_WEIGHT
    a = random_q(rng, (3, 4, 40), dtype)
    b = rng.integers(lo, EXACT_INT8_WEIGHT + 1, (40, 6)).astype(dtype)
    za, zb, zo = dtype(7), dtype(3), dtype(5)
    sa, sb, so = np.float32(0.03), np.float32(0.02), np.float32(0.05)
    (want,) = run_onnx_op(
        "QLinearMatMul", [a, sa, za, b, sb, zb, so, zo], initializers=[1, 2, 4, 5, 6, 7]
    )
    np.testing.assert_array_equal(qlinear_matmul_reference(a, sa, za, b, sb, zb, so, zo), want)


def test_fully_connected_is_bit_exact_with_qlinearmatmul_per_column():
    """FULLY_CONNECTED with per-output-channel weights equals QLinearMatMul with per-column
    b (onnxruntime's form of a quantized Gemm/MatMul with constant weights), exactly."""
    rng = np.random.default_rng(13)
    x = random_q(rng, (5, 300), np.int8)
    w = rng.integers(-127, 128, (12, 300)).astype(np.int8)
    sx, zx, so, zo = np.float32(0.04), np.int8(3), np.float32(0.3), np.int8(-5)
    sw = rng.uniform(0.001, 0.01, 12).astype(np.float32)
    acc = (x.astype(np.int64) - int(zx)) @ w.T.astype(np.int64)
    want = requantize_onnx(acc, multipliers(sx, sw, so), zo)
    got = run_one_op(
        OpCode.FULLY_CONNECTED,
        [(x, quant(sx, int(zx)), False), (w, quant(sw), True)],
        quant(so, int(zo)),
        np.int8,
        rounding="onnx",
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_is_bit_exact_with_quantizelinear_on_ties(dtype):
    scale = np.float32(0.25)
    zp = dtype(3) if dtype == np.int8 else dtype(128)
    # Exact halves: onnxruntime rounds them to even.
    x = (np.arange(-200, 200, dtype=np.float32) * np.float32(0.125)).reshape(4, 100)
    (want,) = run_onnx_op("QuantizeLinear", [x, scale, zp], initializers=[1, 2])
    got = run_one_op(
        OpCode.QUANTIZE, [(x, None, False)], quant(scale, int(zp)), dtype, rounding="onnx"
    )
    np.testing.assert_array_equal(got, want)


def test_unknown_rounding_mode_is_refused():
    x = np.zeros((1, 4), np.float32)
    with pytest.raises(LiteError, match="rounding"):
        run_one_op(OpCode.QUANTIZE, [(x, None, False)], quant(0.1), np.int8, rounding="even")


@pytest.mark.parametrize(
    "op_type, op", [("Add", OpCode.ADD), ("Sub", OpCode.SUB), ("Mul", OpCode.MUL)]
)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_binary_is_bit_exact_with_qdq_float_op(op_type, op, dtype):
    """A QDQ Add/Sub/Mul that onnxruntime keeps in float (DequantizeLinear, float op,
    QuantizeLinear), as it runs the residual adds of onnxruntime-quantized nets."""
    from onnx import helper

    rng = np.random.default_rng(14)
    a, b = random_q(rng, (2, 8, 5, 5), dtype), random_q(rng, (2, 8, 1, 5), dtype)
    z = (lambda v: dtype(v + 128)) if dtype == np.uint8 else dtype
    p = {
        "sa": np.float32(0.05),
        "za": z(-10),
        "sb": np.float32(0.04),
        "zb": z(3),
        "so": np.float32(0.1 if op_type != "Mul" else 0.3),
        "zo": z(1),
    }
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
        helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
        helper.make_node(op_type, ["fa", "fb"], ["f"]),
        helper.make_node("QuantizeLinear", ["f", "so", "zo"], ["y"]),
    ]
    want = run_onnx_graph(nodes, {"a": a, "b": b}, p)[0]
    got = run_one_op(
        op,
        [(a, quant(p["sa"], int(p["za"])), False), (b, quant(p["sb"], int(p["zb"])), False)],
        quant(p["so"], int(p["zo"])),
        dtype,
        rounding="onnx",
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("plane", [(7, 7), (4, 4), (13, 11)])
def test_global_average_pool_is_bit_exact_with_qlinearglobalaveragepool(plane):
    from onnx import helper

    rng = np.random.default_rng(15)
    x = random_q(rng, (2, 24, *plane), np.uint8)
    p = {"sx": np.float32(0.05), "zx": np.uint8(120), "so": np.float32(0.011), "zo": np.uint8(130)}
    nodes = [
        helper.make_node(
            "QLinearGlobalAveragePool",
            ["x", "sx", "zx", "so", "zo"],
            ["y"],
            domain="com.microsoft",
            channels_last=0,
        )
    ]
    want = run_onnx_graph(nodes, {"x": x}, p)[0]
    got = run_one_op(
        OpCode.GLOBAL_AVG_POOL,
        [(x, quant(p["sx"], int(p["zx"])), False)],
        quant(p["so"], int(p["zo"])),
        np.uint8,
        rounding="onnx",
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "op_type, op, attrs",
    [
        ("Relu", OpCode.RELU, {}),
        ("Clip", OpCode.CLIP, {"min": 0.0, "max": 6.0}),
        ("Sigmoid", OpCode.SIGMOID, {}),
        ("Tanh", OpCode.TANH, {}),
        ("HardSwish", OpCode.HARD_SWISH, {}),
    ],
)
def test_unary_agrees_with_qdq_float_op(op_type, op, attrs):
    """DequantizeLinear -> float op -> QuantizeLinear as onnxruntime runs it unfused.
    Clamps and HardSwish are bit-exact; Sigmoid and Tanh are MLAS's float32
    approximations, which NumPy's float32 exp/tanh match except where the result lies
    within an ulp or so of a rounding tie, so those allow one step on a few entries."""
    from onnx import helper

    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    p = {"sx": np.float32(0.043), "zx": np.int8(-7), "so": np.float32(0.0279), "zo": np.int8(4)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["f"])]
    if op_type == "Clip":
        p["lo"], p["hi"] = np.float32(0.0), np.float32(6.0)
        nodes.append(helper.make_node("Clip", ["f", "lo", "hi"], ["g"]))
    else:
        nodes.append(helper.make_node(op_type, ["f"], ["g"]))
    nodes.append(helper.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"]))
    want = run_onnx_graph(nodes, {"x": x}, p)[0]
    got = run_one_op(
        op,
        [(x, quant(p["sx"], int(p["zx"])), False)],
        quant(p["so"], int(p["zo"])),
        np.int8,
        rounding="onnx",
        **attrs,
    )
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    if op in (OpCode.RELU, OpCode.CLIP, OpCode.HARD_SWISH):
        np.testing.assert_array_equal(got, want)
    else:
        assert diff.max() <= 1
        assert (diff == 0).mean() >= 0.98
