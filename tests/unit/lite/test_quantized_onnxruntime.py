"""sporenet's int8 kernels against onnxruntime's QLinear / QDQ operators.

onnxruntime requantizes with a float multiplier and rounds half to even (QLinearConv,
QLinearMatMul, QuantizeLinear), where TFLite's arithmetic, which sporenet follows, uses a
fixed-point multiplier and rounds half away from zero: results agree within one
quantization step, and exactly on all but the rare ties. Convolutions and matrix products
are compared with the exact integer reference of onnxruntime's arithmetic
(quantized_onnx.py), the other ops with onnxruntime run without graph optimizations.
"""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.ops import OpCode
from tests.unit.lite.onnx_reference import helper, run_onnx_graph, run_onnx_op
from tests.unit.lite.quantized_onnx import qlinear_conv, qlinear_matmul
from tests.unit.lite.quantized_reference import quant, random_q, run_one_op


def assert_within_one_step(got: np.ndarray, want: np.ndarray, exact_share: float) -> None:
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= 1
    assert (diff == 0).mean() >= exact_share


@pytest.mark.parametrize("xdtype", [np.uint8, np.int8])
@pytest.mark.parametrize("group, stride", [(1, 1), (2, 2), (6, 1)])
def test_conv_agrees_with_qlinearconv(xdtype, group, stride):
    rng = np.random.default_rng(group * 10 + stride)
    x = random_q(rng, (1, 6, 9, 9), xdtype)
    o = 6 if group == 6 else 8
    w = rng.integers(-127, 128, (o, 6 // group, 3, 3)).astype(np.int8)
    sx, zx = np.float32(0.02), (np.uint8(128) if xdtype == np.uint8 else np.int8(-3))
    sw = rng.uniform(0.002, 0.01, o).astype(np.float32)
    so, zo = np.float32(0.15), (np.uint8(120) if xdtype == np.uint8 else np.int8(5))
    bias = rng.integers(-2000, 2000, o).astype(np.int32)
    attrs = {"pads": [1, 1, 1, 1], "strides": [stride, stride], "group": group}
    got, want = qlinear_conv(x, sx, zx, w, sw, so, zo, bias, attrs)
    assert_within_one_step(got, want, 0.99)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_matmul_agrees_with_qlinearmatmul(dtype):
    got, want = qlinear_matmul(dtype, 9, 0.4)
    assert_within_one_step(got, want, 0.99)


def test_quantize_and_dequantize_agree_with_onnx():
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((4, 100)) * 3).astype(np.float32)
    scale, zp = np.float32(0.05), np.int8(-4)
    (want,) = run_onnx_op("QuantizeLinear", [x, scale, zp], initializers=[1, 2])
    got = run_one_op(OpCode.QUANTIZE, [(x, None, False)], quant(scale, -4), np.int8)
    # Random floats essentially never land on a tie, where ONNX rounds to even.
    assert_within_one_step(got, want, 0.999)
    (want_f,) = run_onnx_op("DequantizeLinear", [got, scale, zp], initializers=[1, 2])
    got_f = run_one_op(OpCode.DEQUANTIZE, [(got, quant(scale, -4), False)], None)
    np.testing.assert_allclose(got_f, want_f, rtol=1e-6, atol=0)


def test_add_agrees_with_com_microsoft_qlinearadd():
    rng = np.random.default_rng(11)
    a, b = random_q(rng, (2, 8, 5, 5), np.int8), random_q(rng, (2, 8, 5, 5), np.int8)
    params = {
        "sa": np.float32(0.05),
        "za": np.int8(-10),
        "sb": np.float32(0.08),
        "zb": np.int8(3),
        "so": np.float32(0.1),
        "zo": np.int8(1),
    }
    names = ["a", "sa", "za", "b", "sb", "zb", "so", "zo"]
    node = helper.make_node("QLinearAdd", names, ["y"], domain="com.microsoft")
    (want,) = run_onnx_graph([node], {"a": a, "b": b}, params)
    got = run_one_op(
        OpCode.ADD,
        [(a, quant(0.05, -10), False), (b, quant(0.08, 3), False)],
        quant(0.1, 1),
        np.int8,
    )
    assert_within_one_step(got, want, 0.95)
