"""Conv2D against a loop-over-taps NumPy reference and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.errors import ShapeError
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from tests.unit.lite.onnx_reference import run_onnx_op

# float32 GEMMs sum in a different order than the float64 reference; 1e-4 relative is
# well above that rounding for these sizes and far below any indexing mistake.
RTOL, ATOL = 1e-4, 1e-4


def conv_reference(x, w, b=None, strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1):
    """Direct convolution in float64: one einsum per group and kernel tap."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    og = o // group
    out = np.zeros((n, o, oh, ow))
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * dh : i * dh + sh * (oh - 1) + 1 : sh,
                    j * dw : j * dw + sw * (ow - 1) + 1 : sw,
                ]
                out[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, i, j]
                )
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def _data(rng, n, c, h, w, o, group, k, bias):
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(o, c // group, *k)).astype(np.float32)
    b = rng.normal(size=(o,)).astype(np.float32) if bias else None
    return x, wt, b


# (N, C, H, W, O, group, kernel, strides, dilations, pads, bias)
CASES = [
    (1, 3, 8, 8, 4, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),  # im2col, padded
    (2, 4, 7, 9, 5, 1, (3, 2), (2, 1), (1, 1), (0, 1, 2, 0), False),  # asymmetric
    (1, 4, 10, 10, 6, 1, (3, 3), (1, 2), (2, 1), (2, 0, 1, 1), True),  # dilation
    (2, 8, 6, 6, 8, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), True),  # pointwise, N=2
    (1, 8, 6, 6, 4, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), False),  # pointwise, N=1
    (2, 4, 5, 5, 12, 1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), True),  # expanding 1x1
    (1, 6, 9, 9, 3, 1, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0), True),  # strided 1x1
    (2, 6, 8, 8, 4, 2, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),  # grouped
    (1, 6, 8, 7, 9, 3, (2, 3), (2, 2), (1, 2), (1, 0, 0, 2), False),  # grouped, strided
    (1, 5, 9, 9, 5, 5, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),  # depthwise
    (2, 4, 9, 8, 4, 4, (3, 3), (2, 2), (1, 1), (0, 1, 1, 0), False),  # depthwise, s2
    (1, 3, 11, 11, 3, 3, (5, 3), (1, 2), (2, 1), (4, 1, 0, 2), True),  # depthwise, dilated
    (1, 3, 6, 6, 6, 3, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True),  # channel multiplier
    (1, 2, 5, 5, 3, 1, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0), True),  # kernel == input
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[:7]}s{c[7]}d{c[8]}p{c[9]}")
def test_conv2d_matches_reference_and_onnxruntime(case):
    n, c, h, w, o, group, k, strides, dilations, pads, bias = case
    x, wt, b = _data(np.random.default_rng(0), n, c, h, w, o, group, k, bias)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=group)
    inputs = [x, wt] + ([b] if bias else [])
    (ours,) = run_op(OpCode.CONV2D, inputs, **attrs)
    ref = conv_reference(x, wt, b, strides, dilations, pads, group)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    (ort,) = run_onnx_op("Conv", inputs, initializers=range(1, len(inputs)), **attrs)
    np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("group,o", [(1, 4), (3, 3)])  # im2col and depthwise
@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_auto_pad_matches_onnxruntime(auto_pad, group, o, stride):
    x, wt, b = _data(np.random.default_rng(1), 1, 3, 8, 7, o, group, (3, 2), True)
    attrs = dict(auto_pad=auto_pad, strides=[stride, stride], group=group)
    (ours,) = run_op(OpCode.CONV2D, [x, wt, b], **attrs)
    (ort,) = run_onnx_op("Conv", [x, wt, b], initializers=[1, 2], **attrs)
    assert ours.shape == ort.shape
    np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "activation,fn",
    [
        ("relu", lambda y: np.maximum(y, 0)),
        ("relu6", lambda y: np.clip(y, 0, 6)),
        ("tanh", np.tanh),
    ],
)
@pytest.mark.parametrize("group,o,k", [(1, 4, 3), (4, 4, 3), (1, 6, 1)])
def test_conv2d_fused_activation(activation, fn, group, o, k):
    x, wt, b = _data(np.random.default_rng(2), 1, 4, 6, 6, o, group, (k, k), True)
    x *= 3  # push values past relu6's upper bound too
    pads = [k // 2] * 4
    (ours,) = run_op(OpCode.CONV2D, [x, wt, b], pads=pads, group=group, activation=activation)
    ref = fn(conv_reference(x, wt, b, pads=pads, group=group))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("group,o,k", [(1, 4, 3), (4, 4, 3), (1, 6, 1), (2, 4, 3)])
def test_conv2d_runtime_weights(group, o, k):
    """Weights fed as a run-time tensor (on-device training) go through the same paths."""
    x, wt, b = _data(np.random.default_rng(3), 2, 4, 5, 6, o, group, (k, k), True)
    (ours,) = run_op(OpCode.CONV2D, [x, wt, b], constant_inputs=[], pads=[1, 0, 0, 1], group=group)
    ref = conv_reference(x, wt, b, pads=(1, 0, 0, 1), group=group)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "k,strides,pads,group,o,expected",
    [
        ((1, 1), [1, 1], [0, 0, 0, 0], 1, 8, "pointwise"),
        ((1, 1), [2, 2], [0, 0, 0, 0], 1, 8, "im2col"),
        ((3, 3), [1, 1], [1, 1, 1, 1], 4, 4, "depthwise"),
        ((3, 3), [1, 1], [1, 1, 1, 1], 4, 8, "im2col"),
        ((3, 3), [1, 1], [0, 0, 0, 0], 1, 8, "im2col"),
    ],
)
def test_conv2d_picks_fast_path(k, strides, pads, group, o, expected):
    specs = [
        TensorSpec((1, 4, 8, 8), np.dtype(np.float32)),
        TensorSpec((o, 4 // group, *k), np.dtype(np.float32)),
    ]
    kernel = Conv2D(Attrs("CONV2D", dict(strides=strides, pads=pads, group=group)), specs)
    assert kernel.strategy == expected


def test_conv2d_bind_computes_into_planned_buffers_repeatedly():
    """The padded scratch keeps its zero border across calls with changing inputs."""
    rng = np.random.default_rng(4)
    for group, o in [(1, 5), (3, 3)]:
        wt = rng.normal(size=(o, 3 // group, 3, 3)).astype(np.float32)
        x = np.empty((1, 3, 6, 6), np.float32)
        out = np.empty((1, o, 6, 6), np.float32)
        kernel = Conv2D(
            Attrs("CONV2D", dict(pads=[1, 1, 1, 1], group=group)),
            [TensorSpec(x.shape, x.dtype), TensorSpec(wt.shape, wt.dtype, wt)],
        )
        step = kernel.bind([x, wt], [out])
        for _ in range(3):
            x[...] = rng.normal(size=x.shape) * 100
            step()
            np.testing.assert_allclose(
                out, conv_reference(x, wt, pads=(1, 1, 1, 1), group=group), rtol=RTOL, atol=1e-3
            )


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs,message",
    [
        ((1, 3, 8, 8), (4, 3, 3), {}, "weights must be 4-D"),
        ((1, 3, 8), (4, 3, 3, 3), {}, "input must be 4-D"),
        ((1, 3, 8, 8), (4, 2, 3, 3), {}, "input has 3 channels"),
        ((1, 4, 8, 8), (6, 2, 3, 3), {"group": 3}, "group=3 must be positive and divide"),
        ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": [1, 1, 1]}, "pads must hold 4 values"),
        ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": [1, -1, 1, 1]}, "pads must be non-negative"),
        ((1, 3, 8, 8), (4, 3, 3, 3), {"strides": [0, 1]}, "'strides' must be positive"),
        ((1, 3, 4, 4), (4, 3, 5, 5), {}, "larger than the padded input"),
        ((1, 3, 8, 8), (4, 3, 3, 3), {"auto_pad": "SAME"}, "auto_pad must be one of"),
        (
            (1, 3, 8, 8),
            (4, 3, 3, 3),
            {"auto_pad": "VALID", "pads": [1, 1, 1, 1]},
            "cannot be combined",
        ),
        ((1, 3, 8, 8), (4, 3, 3, 3), {"kernel_shape": [5, 5]}, "kernel_shape"),
        ((1, 3, 8, 8), (4, 3, 3, 3), {"activation": "swish"}, "unknown fused activation"),
    ],
)
def test_conv2d_shape_errors(x_shape, w_shape, attrs, message):
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.float32)
    with pytest.raises(ShapeError, match=message):
        run_op(OpCode.CONV2D, [x, w], **attrs)


def test_conv2d_bias_shape_error():
    x, w = np.zeros((1, 3, 8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(ShapeError, match=r"bias must have shape \[4\]"):
        run_op(OpCode.CONV2D, [x, w, np.zeros(3, np.float32)])


def test_conv_net_end_to_end_with_dynamic_batch():
    """A small CNN through ModelBuilder, save/load and Interpreter, at batch 1 then 3."""
    from sporenet.lite import Interpreter
    from sporenet.lite.builder import ModelBuilder
    from sporenet.lite.format import parse, serialize

    rng = np.random.default_rng(6)
    w1 = rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.3
    b1 = rng.normal(size=8).astype(np.float32)
    w2 = rng.normal(size=(8, 1, 3, 3)).astype(np.float32) * 0.3
    w3 = rng.normal(size=(16, 8, 1, 1)).astype(np.float32) * 0.3
    b3 = rng.normal(size=16).astype(np.float32)
    fc = rng.normal(size=(5, 16)).astype(np.float32)

    b = ModelBuilder()
    x = b.input("image", (-1, 3, 12, 12))
    h = b.op(
        OpCode.CONV2D,
        [x, b.constant("w1", w1), b.constant("b1", b1)],
        pads=[1, 1, 1, 1],
        activation="relu",
    )
    h = b.op(OpCode.MAX_POOL2D, [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.op(
        OpCode.CONV2D, [h, b.constant("w2", w2)], pads=[1, 1, 1, 1], group=8, activation="relu6"
    )
    h = b.op(OpCode.CONV2D, [h, b.constant("w3", w3), b.constant("b3", b3)])
    h = b.op(OpCode.GLOBAL_AVG_POOL, [h])
    h = b.op(OpCode.FLATTEN, [h])
    b.output(b.op(OpCode.FULLY_CONNECTED, [h, b.constant("fc", fc)]), name="logits")
    model = parse(serialize(b.build()))

    def reference(image):
        y = np.maximum(conv_reference(image, w1, b1, pads=(1, 1, 1, 1)), 0)
        n, c, hh, ww = y.shape
        y = y.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
        y = np.clip(conv_reference(y, w2, pads=(1, 1, 1, 1), group=8), 0, 6)
        y = conv_reference(y, w3, b3)
        return y.mean(axis=(2, 3)) @ fc.T.astype(np.float64)

    interp = Interpreter(model=model, num_threads=1)
    for batch in (1, 3, 1):
        image = rng.normal(size=(batch, 3, 12, 12)).astype(np.float32)
        logits = interp.run({"image": image})["logits"]
        assert logits.shape == (batch, 5)
        np.testing.assert_allclose(logits, reference(image), rtol=RTOL, atol=ATOL)


def conv_transpose_reference(
    x,
    w,
    b=None,
    strides=(1, 1),
    dilations=(1, 1),
    pads=(0, 0, 0, 0),
    output_padding=(0, 0),
    group=1,
):
    """Scatter every input pixel times each kernel tap onto the output, in float64."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    full = (
        sh * (h - 1) + (kh - 1) * dh + 1 + output_padding[0],
        sw * (wd - 1) + (kw - 1) * dw + 1 + output_padding[1],
    )
    canvas = np.zeros((n, og * group, *full))
    cg = c // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                canvas[
                    :,
                    g * og : (g + 1) * og,
                    i * dh : i * dh + sh * (h - 1) + 1 : sh,
                    j * dw : j * dw + sw * (wd - 1) + 1 : sw,
                ] += np.einsum(
                    "nchw,co->nohw",
                    x[:, g * cg : (g + 1) * cg].astype(np.float64),
                    w[g * cg : (g + 1) * cg, :, i, j],
                )
    out = canvas[:, :, pads[0] : full[0] - pads[2], pads[1] : full[1] - pads[3]]
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1)
    return out


# (N, C, H, W, O, group, kernel, strides, dilations, pads, output_padding, bias)
TRANSPOSE_CASES = [
    (1, 3, 4, 4, 2, 1, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), (0, 0), True),
    (2, 4, 3, 5, 6, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (1, 1), False),
    (1, 4, 5, 4, 4, 2, (2, 3), (2, 1), (1, 2), (0, 1, 1, 0), (1, 0), True),
    (1, 4, 3, 3, 4, 4, (4, 4), (2, 2), (1, 1), (1, 1, 1, 1), (0, 0), True),  # depthwise up
    (2, 6, 3, 5, 4, 1, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), (0, 0), True),  # taps tile out
    (1, 4, 4, 3, 6, 2, (3, 2), (3, 2), (1, 1), (0, 0, 0, 0), (0, 0), False),  # tile, grouped
    (1, 16, 6, 7, 1, 1, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), (0, 0), True),  # tile, to 1 channel
]


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
@pytest.mark.parametrize(("k", "group", "c"), [(2, 1, 1), (2, 1, 3), (3, 2, 4)])
def test_input_gradient_whose_taps_tile_matches_the_transposed_convolution(
    k, group, c, channels_last
):
    # Kernel == stride, no pads (a decoder's upsampling head, TFLite's TRANSPOSE_CONV):
    # every dx position has one tap, copied straight into place, from g as it is stored
    # when that is channels-last. The float64 transposed convolution is the reference.
    rng = np.random.default_rng(8)
    o, h, w = 4 * group, 5, 6
    g = rng.normal(size=(1, o, h, w)).astype(np.float32)
    wt = rng.normal(size=(o, c // group, k, k)).astype(np.float32)
    attrs = dict(strides=[k, k], pads=[0, 0, 0, 0], group=group, input_shape=[1, c, h * k, w * k])
    last = np.ascontiguousarray(g.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    src = last if channels_last else g
    (ours,) = run_op(OpCode.CONV2D_BACKPROP_INPUT, [src, wt], **attrs)
    ref = conv_transpose_reference(g, wt, None, (k, k), (1, 1), (0, 0, 0, 0), (0, 0), group)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=str)
def test_conv_transpose_matches_reference_and_onnxruntime(case):
    n, c, h, w, o, group, k, strides, dilations, pads, out_pad, bias = case
    rng = np.random.default_rng(7)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, o // group, *k)).astype(np.float32)
    b = rng.normal(size=o).astype(np.float32) if bias else None
    attrs = dict(
        strides=list(strides),
        dilations=list(dilations),
        pads=list(pads),
        output_padding=list(out_pad),
        group=group,
    )
    inputs = [x, wt] + ([b] if bias else [])
    (ours,) = run_op(OpCode.CONV_TRANSPOSE2D, inputs, **attrs)
    ref = conv_transpose_reference(x, wt, b, strides, dilations, pads, out_pad, group)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)
    (ort,) = run_onnx_op("ConvTranspose", inputs, initializers=range(1, len(inputs)), **attrs)
    np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=ATOL)
    # Run-time weights take the same path without the pre-packed copy.
    (runtime,) = run_op(OpCode.CONV_TRANSPOSE2D, inputs, constant_inputs=[], **attrs)
    np.testing.assert_allclose(runtime, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "w_shape,attrs,message",
    [
        ((3, 2, 3), {}, "weights must be 4-D"),
        ((4, 2, 3, 3), {}, "input has 3 channels"),
        ((3, 2, 3, 3), {"auto_pad": "SAME_UPPER"}, "only explicit pads"),
        ((3, 2, 3, 3), {"output_padding": [2, 0], "strides": [2, 2]}, "output_padding"),
        ((3, 2, 3, 3), {"pads": [3, 3, 3, 3]}, "leave no output"),
    ],
)
def test_conv_transpose_errors(w_shape, attrs, message):
    x, w = np.zeros((1, 3, 4, 4), np.float32), np.zeros(w_shape, np.float32)
    with pytest.raises(ShapeError, match=message):
        run_op(OpCode.CONV_TRANSPOSE2D, [x, w], **attrs)


@pytest.mark.parametrize("layout_limit", [0, 10**9], ids=["planar", "interleaved"])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize(
    "n,c,h,w,k,strides,dilations,pads",
    [
        (1, 5, 9, 9, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        (2, 4, 10, 9, (3, 3), (2, 2), (1, 1), (1, 0, 1, 1)),
        (1, 3, 11, 12, (3, 5), (2, 3), (2, 1), (2, 1, 0, 2)),
        (2, 6, 7, 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ],
)
def test_depthwise_layouts(
    monkeypatch, layout_limit, constant, n, c, h, w, k, strides, dilations, pads
):
    """Both depthwise layouts (chosen by plane size) on every stride/dilation shape."""
    from sporenet.lite.kernels import depthwise

    monkeypatch.setattr(depthwise, "_SMALL_PLANE", layout_limit)
    x, wt, b = _data(np.random.default_rng(8), n, c, h, w, c, c, k, True)
    (ours,) = run_op(
        OpCode.CONV2D,
        [x, wt, b],
        constant_inputs=None if constant else [0],
        strides=list(strides),
        dilations=list(dilations),
        pads=list(pads),
        group=c,
    )
    ref = conv_reference(x, wt, b, strides, dilations, pads, c)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("min_channels", [1, 10**9], ids=["channels-last", "planar"])
@pytest.mark.parametrize(
    "n,c,h,w,o,k,strides,dilations,pads",
    [
        (1, 32, 4, 4, 16, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        (2, 8, 7, 6, 5, (3, 2), (2, 1), (1, 2), (0, 1, 2, 1)),
        (1, 6, 9, 9, 4, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0)),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_im2col_layouts(
    monkeypatch, min_channels, n, c, h, w, o, k, strides, dilations, pads, bias
):
    """The channels-last column build (narrow outputs) matches the planar one; a constant
    bias rides in the GEMM as a column of ones in both."""
    from sporenet.lite.kernels import conv

    monkeypatch.setattr(conv, "_HWC_MIN_CH", min_channels)
    x, wt, b = _data(np.random.default_rng(9), n, c, h, w, o, 1, k, bias)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads))
    inputs = [x, wt] + ([b] if bias else [])
    (ours,) = run_op(OpCode.CONV2D, inputs, activation="relu", **attrs)
    ref = np.maximum(conv_reference(x, wt, b, strides, dilations, pads), 0)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "constant_weights,out_hw,strides,strategy",
    [
        (False, 8, [1, 1], "im2col"),  # run-time weights cannot be transformed at load
        (True, 8, [2, 2], "im2col"),  # F(2x2, 3x3) is for stride 1
        (True, 4, [1, 1], "im2col"),  # too few output positions (below _WINOGRAD_MIN_PLANE)
        (True, 7, [1, 1], "winograd4"),  # 64 x 64 weights: F(4x4) pays from 4 tiles on
        (True, 14, [1, 1], "winograd4"),  # 16 tiles of 4x4 for 64 x 64 weights
        (True, 28, [1, 1], "winograd4"),
    ],
)
def test_winograd_only_where_it_applies(constant_weights, out_hw, strides, strategy):
    x = TensorSpec((1, 64, out_hw, out_hw), np.dtype(np.float32))
    w = np.ones((64, 64, 3, 3), np.float32)
    spec_w = TensorSpec(w.shape, w.dtype, w if constant_weights else None)
    attrs = Attrs("Conv", {"pads": [1, 1, 1, 1], "strides": strides})
    assert Conv2D(attrs, [x, spec_w]).strategy == strategy


@pytest.mark.parametrize("size", [7, 5000])  # below and above activation._SMALL
@pytest.mark.parametrize(
    "name,reference",
    [
        ("relu", lambda y: np.maximum(y, 0)),
        ("relu6", lambda y: np.clip(y, 0, 6)),
    ],
)
def test_fused_relu_paths_match_numpy(size, name, reference):
    """Both ReLU paths (maximum for tiny tensors, the clip ufunc above) and ReLU6 give
    NumPy's values, NaN and infinities included."""
    from sporenet.lite.kernels.activation import fused_activation

    y = np.random.default_rng(11).normal(size=size).astype(np.float32) * 10
    y[:3] = [np.nan, np.inf, -np.inf]
    expected = reference(y.copy())
    fused_activation("CONV2D", {"activation": name})(y)
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["none", "relu6"])
def test_pointwise_head_with_large_weights_on_a_small_map(bias, activation):
    # 1280 x 160 weights (800 KB) over a 3x3 map: the transposed GEMM path.
    rng = np.random.default_rng(21)
    x = rng.normal(size=(1, 160, 3, 3)).astype(np.float32)
    wt = rng.normal(size=(1280, 160, 1, 1)).astype(np.float32)
    b = rng.normal(size=1280).astype(np.float32) if bias else None
    inputs = [x, wt] + ([b] if bias else [])
    (ours,) = run_op(OpCode.CONV2D, inputs, activation=activation)
    ref = conv_reference(x, wt, b, (1, 1), (1, 1), (0, 0, 0, 0), 1)
    if activation == "relu6":
        ref = np.clip(ref, 0, 6)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "pads"),
    [
        ((8, 32, 1, 21), (48, 32, 1, 11), (0, 0, 0, 0)),
        ((3, 40, 6, 6), (16, 40, 2, 3), (1, 0, 0, 1)),
    ],
    ids=["1d-batch", "2d-batch"],
)
def test_narrow_outputs_of_a_batch_in_one_gemm(x_shape, w_shape, pads, with_bias):
    # Many channels and outputs at most 16 wide build their columns channels-last
    # (im2col.bind_im2col_hwc); a batch of such images is multiplied as one GEMM and its
    # result spread back to each image.
    rng = np.random.default_rng(7)
    x = rng.normal(size=x_shape).astype(np.float32)
    w = (rng.normal(size=w_shape) * 0.1).astype(np.float32)
    b = rng.normal(size=w_shape[0]).astype(np.float32) if with_bias else None
    inputs = [x, w] + ([b] if with_bias else [])
    (got,) = run_op(OpCode.CONV2D, inputs, pads=list(pads))
    want = conv_reference(x, w, b, pads=pads)
    # float32 sums of up to 360 products of O(1) values against a float64 reference.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
