"""TFLite math and data movement ops, one op per model, compared with LiteRT."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.proto import tflite_schema_generated as tfl
from tests.unit.converter.tflite_builder import TfliteBuilder, rand
from tests.unit.converter.tflite_ops_check import assert_matches_litert

pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)

X = rand(1, 5, 6, 3, seed=1)


def unary_model(op, shape, out_shape=None, consts=(), options=None, out_dtype=np.float32, **f):
    """One op reading input x (and constants `consts`, (name, value, dtype))."""
    b = TfliteBuilder()
    x = b.input("x", shape)
    inputs = [x] + [b.const(n, v, d) for n, v, d in consts]
    out = b.output(b.tensor("out", out_shape or shape, out_dtype))
    b.op(op, inputs, [out], options, **f)
    return b.build()


@pytest.mark.parametrize("op", ["SIN", "COS"])
def test_trigonometry(op):
    assert_matches_litert(unary_model(op, X.shape), {"x": X * 3})


def test_pow_atan2_and_squared_difference():
    b = TfliteBuilder()
    x, y = b.input("x", [2, 3]), b.input("y", [3])
    p = b.output(b.tensor("pow", [2, 3]))
    b.op("POW", [x, y], [p])
    a = b.output(b.tensor("atan2", [2, 3]))
    b.op("ATAN2", [p, x], [a])  # LiteRT's ATAN2 does not broadcast
    d = b.output(b.tensor("sqdiff", [2, 3]))
    b.op("SQUARED_DIFFERENCE", [x, y], [d])
    feeds = {"x": np.abs(rand(2, 3, seed=3)) + 0.1, "y": rand(3, seed=4)}
    assert_matches_litert(b.build(), feeds)


def test_squared_difference_after_a_convolution_keeps_its_layout():
    # An NHWC tensor held as NCHW (after a CONV_2D) against a per-channel constant.
    from tests.unit.converter.tflite_builder import conv

    b = TfliteBuilder()
    x = b.input("x", [1, 5, 6, 3])
    c = conv(b, x, 3, 4, (5, 6))
    d = b.output(b.tensor("sqdiff", [1, 5, 6, 4]))
    b.op("SQUARED_DIFFERENCE", [c, b.const("mean", rand(4, seed=8))], [d])
    assert_matches_litert(b.build(), {"x": X})


def test_l2_normalization_and_log_softmax():
    b = TfliteBuilder()
    x = b.input("x", [2, 3, 5])
    n = b.output(b.tensor("l2", [2, 3, 5]))
    b.op("L2_NORMALIZATION", [x], [n], "L2NormOptions")
    s = b.output(b.tensor("logsoftmax", [2, 3, 5]))
    b.op("LOG_SOFTMAX", [x], [s], "LogSoftmaxOptions")
    value = rand(2, 3, 5, seed=5)
    value[0, 0] = 0.0  # a zero vector: divided by the epsilon, not by zero
    assert_matches_litert(b.build(), {"x": value})


def test_local_response_normalization():
    model = unary_model(
        "LOCAL_RESPONSE_NORMALIZATION",
        [1, 4, 4, 7],
        options="LocalResponseNormalizationOptions",
        Radius=2,
        Bias=1.5,
        Alpha=0.3,
        Beta=0.6,
    )
    assert_matches_litert(model, {"x": rand(1, 4, 4, 7, seed=6)})


@pytest.mark.parametrize(("op", "dtype"), [("ARG_MAX", np.int64), ("ARG_MIN", np.int32)])
def test_arg_max_and_min(op, dtype):
    options = "ArgMaxOptions" if op == "ARG_MAX" else "ArgMinOptions"
    model = unary_model(
        op,
        X.shape,
        out_shape=[1, 5, 3],
        consts=[("axis", np.array([2]), np.int32)],
        options=options,
        out_dtype=dtype,
        OutputType=tfl.TensorType.INT64 if dtype == np.int64 else tfl.TensorType.INT32,
    )
    assert_matches_litert(model, {"x": X})


def test_reverse_tile_broadcast_and_mirror_pad():
    b = TfliteBuilder()
    x = b.input("x", [2, 3, 4])
    r = b.output(b.tensor("reversed", [2, 3, 4]))
    b.op("REVERSE_V2", [x, b.const("axes", [1, 2], np.int32)], [r])
    t = b.output(b.tensor("tiled", [4, 3, 8]))
    b.op("TILE", [x, b.const("multiples", [2, 1, 2], np.int32)], [t])
    small = b.input("small", [3, 1])
    e = b.output(b.tensor("broadcast", [2, 3, 4]))
    b.op("BROADCAST_TO", [small, b.const("shape", [2, 3, 4], np.int32)], [e], version=2)
    m = b.output(b.tensor("mirrored", [2, 6, 5]))
    paddings = b.const("paddings", [[0, 0], [1, 2], [0, 1]], np.int32)
    b.op("MIRROR_PAD", [x, paddings], [m], "MirrorPadOptions", Mode=tfl.MirrorPadMode.REFLECT)
    feeds = {"x": rand(2, 3, 4, seed=7), "small": rand(3, 1, seed=8)}
    assert_matches_litert(b.build(), feeds)


def test_gather_nd_cumsum_and_one_hot():
    b = TfliteBuilder()
    x = b.input("x", [3, 4, 2])
    g = b.output(b.tensor("gathered", [2, 2]))
    indices = b.const("indices", [[0, 1], [2, 3]], np.int32)
    b.op("GATHER_ND", [x, indices], [g])
    for name, exclusive, reverse in (("cs", False, False), ("cs_ex_rev", True, True)):
        c = b.output(b.tensor(name, [3, 4, 2]))
        b.op(
            "CUMSUM",
            [x, b.const(f"{name}_axis", 1, np.int32)],
            [c],
            "CumsumOptions",
            Exclusive=exclusive,
            Reverse=reverse,
        )
    labels = b.input("labels", [4], np.int32)
    h = b.output(b.tensor("onehot", [4, 3]))
    b.op(
        "ONE_HOT",
        [labels, b.const("depth", 3, np.int32), b.const("on", 2.0), b.const("off", -1.0)],
        [h],
        "OneHotOptions",
        Axis=-1,
    )
    feeds = {"x": rand(3, 4, 2, seed=9), "labels": np.array([0, 2, 1, 5], np.int32)}
    assert_matches_litert(b.build(), feeds)


@pytest.mark.parametrize("length", [(1, 16), (4, 8)])
def test_rfft2d_and_its_parts(length):
    # 3 x 12 frames: the FFT crops rows and zero-pads columns (or the other way round).
    b = TfliteBuilder()
    x = b.input("x", [2, 3, 12])
    spectrum = b.tensor("spectrum", [2, length[0], length[1] // 2 + 1], np.complex64)
    b.op("RFFT2D", [x, b.const("fft_length", length, np.int32)], [spectrum])
    for op, name in (("COMPLEX_ABS", "abs"), ("REAL", "real"), ("IMAG", "imag"), ("CAST", "cast")):
        y = b.output(b.tensor(name, [2, length[0], length[1] // 2 + 1]))
        b.op(op, [spectrum], [y])
    assert_matches_litert(b.build(), {"x": rand(2, 3, 12, seed=11)})
