"""int8 forms of TFLite ops (MEAN, SUM, REDUCE_MAX/MIN), one op per model, compared with
LiteRT within one quantization step, and with a float64 model of TFLite's reference
integer arithmetic exactly."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_tflite
from sporenet.lite import Interpreter
from sporenet.lite.kernels.quantized.reduce import mean_multiplier
from tests.unit.converter.tflite_builder import TfliteBuilder
from tests.unit.converter.tflite_ops_check import assert_matches_litert

pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)

IN_Q = ([0.05], [-3], 0)


def reduce_model(op: str, axes, keep: bool, out_shape, out_q=IN_Q) -> bytes:
    b = TfliteBuilder()
    x = b.input("x", [2, 5, 6, 4], np.int8, quant=IN_Q)
    y = b.output(b.tensor("y", out_shape, np.int8, quant=out_q))
    b.op(op, [x, b.const("axes", axes, np.int32)], [y], "ReducerOptions", KeepDims=keep)
    return b.build()


def _x(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, (2, 5, 6, 4)).astype(np.int8)


@pytest.mark.parametrize(
    ("axes", "keep", "out_shape"),
    [
        ([1, 2], True, [2, 1, 1, 4]),
        ([1, 2], False, [2, 4]),
        ([3], False, [2, 5, 6]),
        ([0, 1, 2, 3], False, []),
    ],
)
def test_int8_mean(axes, keep, out_shape):
    for out_q in (IN_Q, ([0.02], [10], 0)):
        assert_matches_litert(reduce_model("MEAN", axes, keep, out_shape, out_q), {"x": _x()})


def test_int8_sum_and_extremes():
    assert_matches_litert(reduce_model("SUM", [2], False, [2, 5, 4], ([0.4], [1], 0)), {"x": _x(1)})
    for op in ("REDUCE_MAX", "REDUCE_MIN"):
        assert_matches_litert(reduce_model(op, [1], True, [2, 1, 6, 4]), {"x": _x(2)})


def _mbqm(x: np.ndarray, m: int, shift: int) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier on int32 values, in Python integers."""
    out = []
    for v in x.reshape(-1).tolist():
        v <<= max(shift, 0)
        p = v * m
        high = (p + (1 << 30)) >> 31 if p >= 0 else -((-p + (1 << 30) - 1) >> 31)
        right = max(-shift, 0)
        if right:
            high = (high + (1 << (right - 1)) - (high < 0)) >> right
        out.append(high)
    return np.array(out, np.int64).reshape(x.shape)


def test_int8_mean_is_tflites_reference_arithmetic_exactly():
    # A float64-free model of reference_ops::QuantizedMeanOrSum: the converted model must
    # give the same integers (LiteRT's optimized kernels may round differently).
    from sporenet.lite.kernels.quantized.fixed_point import quantize_multiplier

    out_q = ([0.013], [7], 0)
    x = _x(3)
    got = Interpreter(
        model_content=convert_tflite(reduce_model("MEAN", [1, 2], False, [2, 4], out_q))
    ).run({"x": x})["y"]
    n = 30
    m, shift = mean_multiplier(*quantize_multiplier(0.05 / 0.013), n)
    sums = x.astype(np.int64).sum(axis=(1, 2)) - (-3) * n
    want = np.clip(_mbqm(sums, m, shift) + 7, -128, 127)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("op", "align", "half"),
    [
        ("RESIZE_BILINEAR", False, False),
        ("RESIZE_BILINEAR", True, False),
        ("RESIZE_BILINEAR", False, True),
        ("RESIZE_NEAREST_NEIGHBOR", False, False),
        ("RESIZE_NEAREST_NEIGHBOR", True, False),
    ],
)
def test_int8_resize(op, align, half):
    b = TfliteBuilder()
    x = b.input("x", [1, 5, 6, 3], np.int8, quant=IN_Q)
    y = b.output(b.tensor("y", [1, 9, 13, 3], np.int8, quant=IN_Q))
    options = "ResizeBilinearOptions" if op == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
    b.op(
        op,
        [x, b.const("size", [9, 13], np.int32)],
        [y],
        options,
        AlignCorners=align,
        HalfPixelCenters=half,
    )
    x_value = np.random.default_rng(5).integers(-128, 128, (1, 5, 6, 3)).astype(np.int8)
    assert_matches_litert(b.build(), {"x": x_value})


def test_int8_maximum_minimum_and_leaky_relu():
    b = TfliteBuilder()
    x = b.input("x", [2, 5, 6, 4], np.int8, quant=IN_Q)
    y = b.input("y", [4], np.int8, quant=IN_Q)
    for op in ("MAXIMUM", "MINIMUM"):
        b.op(op, [x, y], [b.output(b.tensor(op.lower(), [2, 5, 6, 4], np.int8, quant=IN_Q))])
    for name, out_q in (("leaky_same", IN_Q), ("leaky_rescaled", ([0.03], [5], 0))):
        out = b.output(b.tensor(name, [2, 5, 6, 4], np.int8, quant=out_q))
        b.op("LEAKY_RELU", [x], [out], "LeakyReluOptions", Alpha=0.2)
    y_value = np.array([-100, -3, 0, 90], np.int8)
    assert_matches_litert(b.build(), {"x": _x(4), "y": y_value})


@pytest.mark.parametrize(("padding", "stride", "out"), [(0, 2, 8), (1, 2, 9), (0, 1, 4)])
def test_int8_transpose_conv(padding, stride, out):
    # padding 0: SAME, 1: VALID (the schema's Padding); per-channel weights and a bias.
    rng = np.random.default_rng(6)
    b = TfliteBuilder()
    x = b.input("x", [1, 4, 4, 3], np.int8, quant=IN_Q)
    w_scales = [0.02, 0.05]
    w = b.tensor(
        "w",
        [2, 3, 3, 3],
        np.int8,
        data=rng.integers(-127, 128, (2, 3, 3, 3)),
        quant=(w_scales, [0, 0], 0),
    )
    bias = b.tensor(
        "bias",
        [2],
        np.int32,
        data=rng.integers(-500, 500, 2),
        quant=([0.05 * s for s in w_scales], [0, 0], 0),
    )
    y = b.output(b.tensor("y", [1, out, out, 2], np.int8, quant=([0.1], [4], 0)))
    b.op(
        "TRANSPOSE_CONV",
        [b.const("shape", [1, out, out, 2], np.int32), w, x, bias],
        [y],
        "TransposeConvOptions",
        Padding=padding,
        StrideW=stride,
        StrideH=stride,
    )
    x_value = rng.integers(-128, 128, (1, 4, 4, 3)).astype(np.int8)
    assert_matches_litert(b.build(), {"x": x_value})


def test_int8_l2_normalization():
    b = TfliteBuilder()
    x = b.input("x", [2, 5, 16], np.int8, quant=IN_Q)
    y = b.output(b.tensor("y", [2, 5, 16], np.int8, quant=([1 / 128], [0], 0)))
    b.op("L2_NORMALIZATION", [x], [y], "L2NormOptions")
    value = np.random.default_rng(8).integers(-128, 128, (2, 5, 16)).astype(np.int8)
    value[0, 0] = -3  # a constant row: every entry its zero point but one
    value[0, 0, 0] = 9
    assert_matches_litert(b.build(), {"x": value})


@pytest.mark.parametrize("op", ["EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS"])
def test_int8_comparisons_of_differently_scaled_operands(op):
    b = TfliteBuilder()
    x = b.input("x", [2, 5, 6, 4], np.int8, quant=IN_Q)
    y = b.input("y", [2, 5, 6, 4], np.int8, quant=([0.1], [2], 0))
    b.op(op, [x, y], [b.output(b.tensor("out", [2, 5, 6, 4], np.bool_))])
    x_value = _x(9)
    # y = x / 2 on half the entries: equal reals across the two scales
    y_value = np.where(_x(10) > 0, np.clip((x_value.astype(int) + 3) // 2 + 2, -128, 127), _x(11))
    assert_matches_litert(b.build(), {"x": x_value, "y": y_value.astype(np.int8)})


def test_int8_squared_difference():
    b = TfliteBuilder()
    x = b.input("x", [2, 5, 6, 4], np.int8, quant=IN_Q)
    y = b.input("y", [4], np.int8, quant=([0.08], [-1], 0))
    out = b.output(b.tensor("out", [2, 5, 6, 4], np.int8, quant=([0.12], [-128], 0)))
    b.op("SQUARED_DIFFERENCE", [x, y], [out])
    y_value = np.array([-100, -3, 0, 90], np.int8)
    assert_matches_litert(b.build(), {"x": _x(12), "y": y_value})
