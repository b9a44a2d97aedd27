"""Quantized models as files: hostile quantization parameters are refused by name, the
weight-only modes (float16 and dynamic-range int8 weights) run in float kernels, and a
small int8 network runs end to end close to its float original."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sporenet.lite.builder import ModelBuilder
from sporenet.lite.errors import ModelFormatError, ShapeError
from sporenet.lite.format import parse, serialize
from sporenet.lite.graph import Quantization
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.ops import OpCode
from tests.unit.lite.format_samples import raw_serialize
from tests.unit.lite.quantized_reference import quant


def int8_fc_model(q: Quantization | None = None) -> tuple:
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.int8)
    b.quantize(x, 0.1, 0)
    w = b.constant("fc.w", np.ones((3, 4), np.int8), quantization=q or quant([0.1] * 3, 0))
    y = b.op(OpCode.FULLY_CONNECTED, [x, w])
    b.quantize(y, 0.5, 0, dtype=np.int8)
    b.output(y, "y")
    return b.build(), w


@pytest.mark.parametrize(
    "bad, message",
    [
        (quant([0.1, np.nan, 0.1], 0), r"'fc.w'.*scales must be finite and > 0, found nan"),
        (quant([0.1, 0.0, 0.1], 0), r"'fc.w'.*scales must be finite and > 0, found 0.0"),
        (quant([0.1, -1.0, 0.1], 0), r"'fc.w'.*found -1.0"),
        (quant([0.1, np.inf, 0.1], 0), r"'fc.w'.*found inf"),
        (quant([0.1] * 3, [0, 300, 0]), r"'fc.w'.*zero point 300 is outside the int8 range"),
        (quant([0.1] * 3, [0, -129, 0]), r"'fc.w'.*zero point -129"),
        (
            quant([0.1] * 4, 0, axis=0),
            r"'fc.w'.*4 per-axis scales do not match axis 0 of shape "
            r"\[3, 4\] \(size 3\)",
        ),
        (quant([0.1] * 3, 0, axis=2), r"'fc.w'.*axis 2 is out of range"),
        (quant([0.1] * 3, 0, axis=-1), r"'fc.w'.*axis -1 is out of range"),
        (
            Quantization(np.array([0.1, 0.1, 0.1], np.float32), np.zeros(2, np.int64)),
            r"'fc.w'.*3 scales but 2 zero points",
        ),
    ],
)
def test_hostile_quantization_parameters_are_refused_by_name(bad, message):
    model, w = int8_fc_model()
    model.tensors[w] = dataclasses.replace(model.tensors[w], quantization=bad)
    data = raw_serialize(model)
    with pytest.raises(ModelFormatError, match=message):
        parse(data)


def test_int8_kernel_refuses_a_weight_quantized_on_the_wrong_axis():
    with pytest.raises(
        ShapeError,
        match=r"per output channel \(axis 0, 3 scales\), got 4 "
        r"scales on axis 1",
    ):
        int8_fc_model(quant([0.1] * 4, 0, axis=1))


def test_int8_output_without_quantization_is_refused():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.int8)
    b.quantize(x, 0.1, 0)
    w = b.constant("w", np.ones((3, 4), np.int8), quantization=quant(0.1))
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, w]), "y")
    with pytest.raises(ShapeError, match=r"output 0 .* needs quantization parameters"):
        b.build()


def float_mlp(weights: dict[str, np.ndarray], qs: dict[str, Quantization] | None = None):
    b = ModelBuilder()
    x = b.input("x", (-1, 8))
    h = b.op(
        OpCode.FULLY_CONNECTED,
        [
            x,
            b.constant("w1", weights["w1"], quantization=(qs or {}).get("w1")),
            b.constant("b1", weights["b1"]),
        ],
        activation="relu",
    )
    y = b.op(
        OpCode.FULLY_CONNECTED,
        [
            h,
            b.constant("w2", weights["w2"], quantization=(qs or {}).get("w2")),
            b.constant("b2", weights["b2"]),
        ],
    )
    b.output(y, "y")
    return serialize(b.build())


def test_float16_weights_feed_float32_ops():
    rng = np.random.default_rng(0)
    w = {
        "w1": rng.standard_normal((16, 8)),
        "b1": rng.standard_normal(16),
        "w2": rng.standard_normal((4, 16)),
        "b2": rng.standard_normal(4),
    }
    f32 = {k: v.astype(np.float32) for k, v in w.items()}
    f16 = {k: v.astype(np.float16) for k, v in w.items()}
    data16 = float_mlp(f16)
    assert len(data16) < len(float_mlp(f32))
    x = rng.standard_normal((5, 8)).astype(np.float32)
    got = Interpreter(model_content=data16).run({"x": x})["y"]
    assert got.dtype == np.float32
    want = Interpreter(
        model_content=float_mlp({k: v.astype(np.float32) for k, v in f16.items()})
    ).run({"x": x})["y"]
    np.testing.assert_array_equal(got, want)  # the float16 values, widened exactly


def test_scalar_weight_only_constants_are_dequantized():
    # A 0-d float16 or int8 constant beside float32 operands is widened at load like any
    # other weight-only constant.
    for value, q in ((np.float16(0.75), None), (np.int8(3), quant(0.25, 0))):
        b = ModelBuilder()
        x = b.input("x", (-1, 4))
        b.output(b.op(OpCode.MUL, [x, b.constant("c", np.asarray(value), quantization=q)]), "y")
        x_in = np.arange(8, dtype=np.float32).reshape(2, 4)
        got = Interpreter(model_content=serialize(b.build())).run({"x": x_in})["y"]
        np.testing.assert_array_equal(got, x_in * np.float32(0.75))


def test_dynamic_range_int8_weights_are_dequantized_once():
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((16, 8)), rng.standard_normal((4, 16))
    s1, s2 = np.abs(w1).max(axis=1) / 127, np.abs(w2).max(axis=1) / 127
    q1 = np.round(w1 / s1[:, None]).astype(np.int8)
    q2 = np.round(w2 / s2[:, None]).astype(np.int8)
    biases = {"b1": np.zeros(16, np.float32), "b2": np.zeros(4, np.float32)}
    data = float_mlp({"w1": q1, "w2": q2, **biases}, {"w1": quant(s1, 0, 0), "w2": quant(s2, 0, 0)})
    x = rng.standard_normal((3, 8)).astype(np.float32)
    it = Interpreter(model_content=data)
    got = it.run({"x": x})["y"]
    dq1 = (q1 * s1.astype(np.float32)[:, None].astype(np.float64)).astype(np.float32)
    dq2 = (q2 * s2.astype(np.float32)[:, None].astype(np.float64)).astype(np.float32)
    want = np.maximum(x @ dq1.T, 0) @ dq2.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    float_ref = np.maximum(x @ w1.T, 0) @ w2.T
    assert np.abs(got - float_ref).max() < 0.05 * np.abs(float_ref).max()


def test_small_int8_cnn_tracks_its_float_original():
    """QUANTIZE -> conv -> relu6 -> depthwise -> add -> pool -> FC -> DEQUANTIZE, with params
    from float statistics: the int8 result stays within a few output steps of float."""
    rng = np.random.default_rng(2)
    wc = rng.standard_normal((8, 3, 3, 3)) * 0.3
    wd = rng.standard_normal((8, 1, 3, 3)) * 0.3
    wf = rng.standard_normal((5, 8)) * 0.3
    x = rng.standard_normal((2, 3, 10, 10)).astype(np.float32)

    def sym(w):
        s = np.abs(w).reshape(len(w), -1).max(axis=1) / 127
        return np.round(w / s.reshape(-1, *[1] * (w.ndim - 1))).astype(np.int8), s

    b = ModelBuilder()
    xi = b.input("x", (2, 3, 10, 10))
    sx = 4 / 127
    xq = b.quantize(b.op(OpCode.QUANTIZE, [xi]), sx, 0, dtype=np.int8)
    qc, sc = sym(wc)
    h = b.op(
        OpCode.CONV2D,
        [xq, b.constant("wc", qc, quantization=quant(sc)), b.constant("bc", np.zeros(8, np.int32))],
        pads=[1, 1, 1, 1],
        activation="relu6",
    )
    sh = 6 / 255
    b.quantize(h, sh, -128, dtype=np.int8)
    qd, sd = sym(wd)
    d = b.op(
        OpCode.CONV2D, [h, b.constant("wd", qd, quantization=quant(sd))], pads=[1, 1, 1, 1], group=8
    )
    b.quantize(d, 0.05, 0, dtype=np.int8)
    s = b.quantize(b.op(OpCode.ADD, [d, h]), 0.06, 0, dtype=np.int8)
    p = b.op(OpCode.GLOBAL_AVG_POOL, [s])
    b.quantize(p, 0.02, 0, dtype=np.int8)
    f = b.op(OpCode.FLATTEN, [p], axis=1)
    qf, sf = sym(wf)
    o = b.quantize(
        b.op(OpCode.FULLY_CONNECTED, [f, b.constant("wf", qf, quantization=quant(sf))]),
        0.01,
        0,
        dtype=np.int8,
    )
    b.output(b.op(OpCode.DEQUANTIZE, [o]), "y")
    got = Interpreter(model_content=serialize(b.build())).run({"x": x})["y"]

    def conv(v, w, group=1):
        n, c, hh, ww = v.shape
        vp = np.pad(v, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((n, w.shape[0], hh, ww))
        og, cg = w.shape[0] // group, c // group
        for g in range(group):
            for i in range(3):
                for j in range(3):
                    out[:, g * og : (g + 1) * og] += np.einsum(
                        "nchw,oc->nohw",
                        vp[:, g * cg : (g + 1) * cg, i : i + hh, j : j + ww],
                        w[g * og : (g + 1) * og, :, i, j],
                    )
        return out

    hf = np.clip(conv(x.astype(np.float64), wc), 0, 6)
    sf_ = conv(hf, wd, 8) + hf
    want = sf_.mean(axis=(2, 3)) @ wf.T
    assert np.abs(got - want).max() < 0.08


def test_scales_whose_ratio_leaves_fixed_point_range_are_refused_at_load():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.int8)
    b.quantize(x, 1e30, 0)
    w = b.constant("w", np.ones((3, 4), np.int8), quantization=quant(1e8))
    b.output(b.quantize(b.op(OpCode.FULLY_CONNECTED, [x, w]), 1e-30, 0, dtype=np.int8), "y")
    with pytest.raises(ShapeError, match=r"FULLY_CONNECTED.*rescaling multiplier .* outside"):
        b.build()


def test_dequantize_node_on_constant_weights_folds_at_load():
    rng = np.random.default_rng(3)
    q = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    scales = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
    b = ModelBuilder()
    x = b.input("x", (1, 2, 5, 5))
    w = b.op(OpCode.DEQUANTIZE, [b.constant("w", q, quantization=quant(scales))])
    b.output(b.op(OpCode.CONV2D, [x, w], pads=[1, 1, 1, 1]), "y")
    it = Interpreter(model_content=serialize(b.build()))
    assert len(it._plan.steps) == 1  # the DEQUANTIZE ran once, at load
    xv = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    wf = (q * scales.astype(np.float64)[:, None, None, None]).astype(np.float32)
    ref = Interpreter(model_content=float_model_with(wf)).run({"x": xv})["y"]
    np.testing.assert_array_equal(it.run({"x": xv})["y"], ref)


def float_model_with(w: np.ndarray) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (1, 2, 5, 5))
    b.output(b.op(OpCode.CONV2D, [x, b.constant("w", w)], pads=[1, 1, 1, 1]), "y")
    return serialize(b.build())


def test_int8_input_details_carry_quantization_like_tflite():
    model, _ = int8_fc_model()
    it = Interpreter(model_content=serialize(model))
    (detail,) = it.get_input_details()
    assert detail["dtype"] is np.int8
    assert detail["quantization"] == (pytest.approx(0.1), 0)
    params = detail["quantization_parameters"]
    np.testing.assert_allclose(params["scales"], [0.1])
    assert params["zero_points"].tolist() == [0] and params["quantized_dimension"] == 0
    out = it.run({"x": np.array([[10, 20, 30, 40]], np.int8)})["y"]
    # 0.1 * 0.1 * 100 / 0.5 = 2.0 per output
    np.testing.assert_array_equal(out, np.full((1, 3), 2, np.int8))
