"""Pad and Resize against NumPy references and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.errors import ShapeError
from sporenet.lite.kernels import resize as resize_module
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.resize import (
    _LONG_ROW,
    Resize,
    _column_gathers,
    _take_columns,
    linear_taps,
)
from tests.unit.lite.onnx_reference import run_onnx_op

# ---------------------------------------------------------------------------------- Pad


def pad_reference(x, pads, mode, value=0.0):
    """np.pad after cropping negative pads (np.pad's 'symmetric' is not ONNX reflect)."""
    rank = x.ndim
    begin, end = pads[:rank], pads[rank:]
    crop = tuple(
        slice(max(-b, 0), x.shape[a] - max(-e, 0))
        for a, (b, e) in enumerate(zip(begin, end, strict=True))
    )
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
    if mode == "constant":
        return np.pad(x[crop], widths, mode="constant", constant_values=value)
    return np.pad(x[crop], widths, mode=mode)


PAD_CASES = [
    ((1, 2, 4, 5), [0, 0, 1, 2, 0, 0, 2, 1]),
    ((2, 3, 4), [1, 0, 2, 0, 2, 1]),
    ((3, 5), [2, 4, 2, 3]),
    ((1, 1, 4, 4), [0, 0, 0, 3, 0, 0, 3, 0]),
    ((1, 2, 5, 6), [0, 0, -1, 2, 0, 0, 1, -2]),  # crop and pad together
    ((6,), [0, 5]),
]


@pytest.mark.parametrize("shape,pads", PAD_CASES, ids=str)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_matches_reference_and_onnxruntime(shape, pads, mode):
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    extra = dict(value=1.5) if mode == "constant" else {}
    (ours,) = run_op(OpCode.PAD, [x], pads=pads, mode=mode, **extra)
    np.testing.assert_array_equal(ours, pad_reference(x, pads, mode, 1.5))
    inputs = [x, np.array(pads, np.int64)]
    if mode == "constant":
        inputs.append(np.array(1.5, np.float32))
    # wrap arrived in opset 19.
    (ort,) = run_onnx_op("Pad", inputs, initializers=range(1, len(inputs)), mode=mode, opset=19)
    np.testing.assert_array_equal(ours, ort)


def test_pad_from_constant_inputs_with_axes():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    pads, axes = np.array([1, 2, 0, 3], np.int64), np.array([-1, 1], np.int64)
    (ours,) = run_op(OpCode.PAD, [x, pads, np.array(-1.0, np.float32), axes])
    ref = np.pad(x, [(0, 0), (2, 3), (1, 0)], constant_values=-1.0)
    np.testing.assert_array_equal(ours, ref)
    (ort,) = run_onnx_op(
        "Pad", [x, pads, np.array(-1.0, np.float32), axes], initializers=[1, 2, 3], opset=18
    )
    np.testing.assert_array_equal(ours, ort)


def test_pad_rewrites_borders_each_call():
    """The planner may reuse the output buffer for other tensors between calls."""
    from sporenet.lite.kernels.base import Attrs, TensorSpec
    from sporenet.lite.kernels.pad import Pad

    x = np.ones((2, 3), np.float32)
    kernel = Pad(Attrs("PAD", dict(pads=[1, 1, 1, 1], value=7.0)), [TensorSpec(x.shape, x.dtype)])
    out = np.empty((4, 5), np.float32)
    step = kernel.bind([x], [out])
    for _ in range(2):
        out[...] = np.nan
        step()
        np.testing.assert_array_equal(out, np.pad(x, 1, constant_values=7.0))


@pytest.mark.parametrize(
    "shape,attrs,message",
    [
        ((2, 3), dict(pads=[1, 1, 1]), "pads must hold 2 values per padded axis"),
        ((2, 3), dict(), "needs a `pads` attribute"),
        ((2, 3), dict(pads=[0, 3, 0, 0], mode="reflect"), "must be smaller than its size"),
        ((2, 3), dict(pads=[0, 0, 0, 0], mode="mirror"), "mode must be one of"),
        ((2, 3), dict(pads=[0, -2, 0, -2]), "below zero elements"),
        ((2, 3), dict(pads=[1, 1], axes=[3]), "must be distinct axes"),
    ],
)
def test_pad_errors(shape, attrs, message):
    with pytest.raises(ShapeError, match=message):
        run_op(OpCode.PAD, [np.zeros(shape, np.float32)], **attrs)


# ------------------------------------------------------------------------------- Resize


def resize_reference(x, out_hw, scales, mode, transform, nearest_mode):
    """Output pixel by output pixel, straight from the ONNX Resize formulas."""
    h, w = x.shape[-2:]
    out = np.zeros((*x.shape[:-2], *out_hw))

    def coord(o, out_len, in_len, scale):
        if transform == "half_pixel":
            return (o + 0.5) / scale - 0.5
        if transform == "pytorch_half_pixel":
            return (o + 0.5) / scale - 0.5 if out_len > 1 else 0.0
        if transform == "align_corners":
            return 0.0 if out_len == 1 else o * (in_len - 1) / (out_len - 1)
        if transform == "half_pixel_symmetric":
            offset = in_len / 2 * (1 - out_len / (scale * in_len))
            return offset + (o + 0.5) / scale - 0.5
        return o / scale

    def nearest(c, in_len):
        frac = c - np.floor(c)
        if nearest_mode == "floor":
            i = np.floor(c)
        elif nearest_mode == "ceil":
            i = np.ceil(c)
        elif frac == 0.5:
            i = np.floor(c) if nearest_mode == "round_prefer_floor" else np.ceil(c)
        else:
            i = np.floor(c + 0.5)
        return int(min(max(i, 0), in_len - 1))

    for oy in range(out_hw[0]):
        cy = coord(oy, out_hw[0], h, scales[0])
        for ox in range(out_hw[1]):
            cx = coord(ox, out_hw[1], w, scales[1])
            if mode == "nearest":
                out[..., oy, ox] = x[..., nearest(cy, h), nearest(cx, w)]
                continue
            cy_, cx_ = min(max(cy, 0), h - 1), min(max(cx, 0), w - 1)
            y0, x0 = int(np.floor(cy_)), int(np.floor(cx_))
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            fy, fx = cy_ - y0, cx_ - x0
            out[..., oy, ox] = (1 - fy) * ((1 - fx) * x[..., y0, x0] + fx * x[..., y0, x1]) + fy * (
                (1 - fx) * x[..., y1, x0] + fx * x[..., y1, x1]
            )
    return out


TRANSFORMS = [
    "half_pixel",
    "asymmetric",
    "align_corners",
    "pytorch_half_pixel",
    "half_pixel_symmetric",
]
# (input shape, scales or None, sizes or None)
RESIZE_CASES = [
    ((1, 2, 4, 5), [1, 1, 2.0, 2.0], None),
    ((2, 1, 6, 6), [1, 1, 0.5, 0.5], None),
    ((1, 3, 5, 4), [1, 1, 1.5, 0.75], None),
    ((1, 2, 3, 7), None, [1, 2, 7, 3]),
    ((1, 1, 4, 4), None, [1, 1, 1, 9]),
]


@pytest.mark.parametrize("shape,scales,sizes", RESIZE_CASES, ids=str)
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize(
    "mode,nearest_mode",
    [
        ("linear", "round_prefer_floor"),
        ("nearest", "round_prefer_floor"),
        ("nearest", "round_prefer_ceil"),
        ("nearest", "floor"),
        ("nearest", "ceil"),
    ],
)
def test_resize_matches_reference_and_onnxruntime(
    shape, scales, sizes, transform, mode, nearest_mode
):
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    attrs = dict(mode=mode, coordinate_transformation_mode=transform, nearest_mode=nearest_mode)
    given = dict(sizes=sizes) if sizes is not None else dict(scales=scales)
    (ours,) = run_op(OpCode.RESIZE, [x], **attrs, **given)
    if sizes is not None:
        out_hw = sizes[2:]
        eff = [o / i for o, i in zip(sizes[2:], shape[2:], strict=True)]
    else:
        out_hw = [
            int(np.float32(i) * np.float32(s)) for i, s in zip(shape[2:], scales[2:], strict=True)
        ]
        eff = scales[2:]
    assert ours.shape == (*shape[:2], *out_hw)
    ref = resize_reference(x.astype(np.float64), out_hw, eff, mode, transform, nearest_mode)
    # The kernel computes coordinates in float32 like onnxruntime; 1e-5 covers the
    # rounding of the interpolation weights.
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    inputs = [x, None, np.array(scales or [], np.float32)]
    if sizes is not None:
        inputs.append(np.array(sizes, np.int64))
    (ort,) = run_onnx_op("Resize", inputs, initializers=range(1, len(inputs)), opset=19, **attrs)
    np.testing.assert_allclose(ours, ort, rtol=1e-5, atol=1e-5)


def test_resize_sizes_and_scales_from_constant_inputs():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    roi = np.array([], np.float32)
    (by_scales,) = run_op(OpCode.RESIZE, [x, roi, np.array([1, 1, 2, 2], np.float32)])
    (by_sizes,) = run_op(
        OpCode.RESIZE, [x, roi, np.array([], np.float32), np.array([1, 1, 8, 8], np.int64)]
    )
    expected = x.repeat(2, axis=2).repeat(2, axis=3)
    np.testing.assert_array_equal(by_scales, expected)
    np.testing.assert_array_equal(by_sizes, expected)


def test_resize_in_a_model_with_dynamic_batch():
    from sporenet.lite import Interpreter
    from sporenet.lite.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (-1, 2, 3, 3))
    b.output(b.op(OpCode.RESIZE, [x], mode="linear", scales=[1.0, 1.0, 2.0, 2.0]), name="y")
    interp = Interpreter(model=b.build())
    for batch in (1, 4):
        data = np.random.default_rng(batch).normal(size=(batch, 2, 3, 3)).astype(np.float32)
        y = interp.run({"x": data})["y"]
        ref = resize_reference(
            data.astype(np.float64),
            (6, 6),
            (2.0, 2.0),
            "linear",
            "half_pixel",
            "round_prefer_floor",
        )
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "attrs,message",
    [
        (dict(), "needs constant `sizes` or `scales`"),
        (dict(scales=[2.0, 2.0]), "must hold 4 values"),
        (dict(scales=[1.0, 2.0, 2.0, 2.0]), "only the last two axes"),
        (dict(sizes=[1, 1, 0, 4]), "sizes must be positive"),
        (dict(scales=[1.0, 1.0, 2.0, 2.0], mode="area"), "mode must be one of"),
        (dict(sizes=[1, 2, 8, 8], scales=[2.0, 2.0]), "scales next to sizes must be 4"),
        (dict(sizes=[1, 2, 8, 8], scales=[1.0, 1.0, 0.0, 2.0]), "positive values"),
        (
            dict(scales=[1.0, 1.0, 2.0, 2.0], coordinate_transformation_mode="tf_crop_and_resize"),
            r"tf_crop_and_resize needs a roi of 8 values .* got \[\]",
        ),
        (
            dict(scales=[1.0, 1.0, 2.0, 2.0], coordinate_transformation_mode="cartesian"),
            "coordinate_transformation_mode must be one of",
        ),
    ],
)
def test_resize_errors(attrs, message):
    with pytest.raises(ShapeError, match=message):
        run_op(OpCode.RESIZE, [np.zeros((1, 2, 4, 4), np.float32)], **attrs)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize(
    "hw, out_hw", [((6, 5), (12, 10)), ((5, 7), (15, 21)), ((4, 3), (16, 12)), ((9, 8), (4, 10))]
)
def test_linear_resize_on_channels_last_storage_gives_the_nchw_values(
    monkeypatch, transform, hw, out_hw
):
    # Channels-last rows of W*C elements take the run-wise row blend of integer upscales
    # and pixel gathers for the columns; NCHW planes of short rows gather rows and slice
    # columns: the same products and sums, so exactly the same values, within the
    # float64 reference's bound. (Small NCHW planes run as two BLAS products instead,
    # tested below: off here, to compare the gathers.)
    monkeypatch.setattr(resize_module, "_DENSE_MACS_PER_OUTPUT", 0)
    c = 64  # channels-last rows of OW*C >= 640 elements, at least resize._LONG_ROW
    assert out_hw[1] * c >= _LONG_ROW > out_hw[1]
    x = np.random.default_rng(6).normal(size=(1, c, *hw)).astype(np.float32)
    attrs = {"mode": "linear", "coordinate_transformation_mode": transform}
    kernel = Resize(
        Attrs("RESIZE", {**attrs, "sizes": [1, c, *out_hw]}), [TensorSpec(x.shape, x.dtype)]
    )
    nchw = np.empty((1, c, *out_hw), np.float32)
    kernel.bind([x], [nchw])()
    x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    last = np.empty((1, *out_hw, c), np.float32).transpose(0, 3, 1, 2)
    kernel.bind([x_last], [last])()
    np.testing.assert_array_equal(last, nchw)
    eff = [o / i for o, i in zip(out_hw, hw, strict=True)]
    ref = resize_reference(x.astype(np.float64), out_hw, eff, "linear", transform, None)
    np.testing.assert_allclose(nchw, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("w, ow", [(5, 10), (7, 21), (4, 16), (6, 9), (8, 4), (1, 3)])
def test_linear_resize_column_slices_equal_the_gathers(transform, w, ow):
    # Integer upscales gather their columns by strided slice copies: the same values as
    # the gathers along the last axis, which every other size keeps.
    kernel = Resize(
        Attrs(
            "RESIZE",
            {"mode": "linear", "coordinate_transformation_mode": transform, "sizes": [1, 2, 3, ow]},
        ),
        [TensorSpec((1, 2, 3, w), np.dtype(np.float32))],
    )
    c0, c1, _, _ = linear_taps(kernel._coords(3), w)
    rows = np.random.default_rng(5).normal(size=(2, 3, w)).astype(np.float32)
    got = [np.full((2, 3, ow), np.nan, np.float32) for _ in range(2)]
    want = [np.full((2, 3, ow), np.nan, np.float32) for _ in range(2)]
    _column_gathers(rows, ((c0, got[0]), (c1, got[1])))()
    _take_columns(rows, ((c0, want[0]), (c1, want[1])))()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize(
    "planes, hw, out_hw, dtype",
    [
        (128, (9, 16), (18, 32), np.float32),  # a segmentation decoder's 2x upscale
        (3, (5, 7), (15, 21), np.float32),
        (2, (9, 8), (4, 10), np.float32),  # rows shrink, columns grow
        (6, (12, 20), (48, 80), np.float64),
        (1, (1, 6), (3, 12), np.float32),  # one input row: both row taps clamp
    ],
    ids=str,
)
def test_small_plane_linear_resize_runs_as_two_products(transform, planes, hw, out_hw, dtype):
    # The dense tap matrices hold the gathers' weights (a clamped edge's two taps added
    # on one input); BLAS sums in its own order, within the float64 reference's bound.
    assert resize_module.uses_dense_linear((planes, *hw), (planes, *out_hw), dtype, dtype)
    x = np.random.default_rng(planes).normal(size=(1, planes, *hw)).astype(dtype)
    attrs = {"mode": "linear", "coordinate_transformation_mode": transform}
    kernel = Resize(
        Attrs("RESIZE", {**attrs, "sizes": [1, planes, *out_hw]}), [TensorSpec(x.shape, x.dtype)]
    )
    out = np.full((1, planes, *out_hw), np.nan, dtype)
    step = kernel.bind([x], [out])
    eff = [o / i for o, i in zip(out_hw, hw, strict=True)]
    ref = resize_reference(x.astype(np.float64), out_hw, eff, "linear", transform, None)
    for _ in range(2):  # a second call on the same buffers
        step()
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        x *= 2
        ref *= 2


def test_dense_linear_resize_only_for_small_planes():
    f = np.dtype(np.float32)
    assert resize_module.uses_dense_linear((128, 9, 16), (128, 18, 32), f, f)
    assert not resize_module.uses_dense_linear((3, 112, 112), (3, 224, 224), f, f)
    assert not resize_module.uses_dense_linear((64, 64, 64), (64, 32, 32), f, f)  # shrinking
    h = np.dtype(np.float16)
    assert not resize_module.uses_dense_linear((128, 9, 16), (128, 18, 32), h, h)


def test_a_linear_upscales_row_pass_reuses_the_column_passs_scratch(monkeypatch):
    # A 2x upscale of channels-last rows: columns first into a mid (H, OW) buffer with a
    # scratch, then the rows by runs, whose two weight products need two mid-sized
    # buffers: one of them is the column pass's scratch (dead by then), so the step takes
    # three mid-sized temporaries, not four. Temporaries start as garbage (0xFF bytes);
    # the values are the float64 reference's.
    from sporenet.lite.kernels.workspace import Workspace, active

    monkeypatch.setattr(resize_module, "_DENSE_MACS_PER_OUTPUT", 0)
    c, hw, out_hw = 32, (12, 10), (24, 20)  # rows of OW*C elements, at least _LONG_ROW
    assert out_hw[1] * c >= _LONG_ROW
    x = np.random.default_rng(7).normal(size=(1, c, *hw)).astype(np.float32)
    kernel = Resize(
        Attrs("RESIZE", {"mode": "linear", "sizes": [1, c, *out_hw]}),
        [TensorSpec(x.shape, x.dtype)],
    )
    taken: list[int] = []

    def take(nbytes: int) -> np.ndarray:
        taken.append(nbytes)
        return np.full(nbytes, 0xFF, np.uint8)

    x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    out = np.empty((1, *out_hw, c), np.float32).transpose(0, 3, 1, 2)
    with active(Workspace(take)):
        step = kernel.bind([x_last], [out])
    mid = hw[0] * out_hw[1] * c * 4
    assert max(taken) == mid and taken.count(mid) == 3, taken
    step()
    eff = [o / i for o, i in zip(out_hw, hw, strict=True)]
    ref = resize_reference(x.astype(np.float64), out_hw, eff, "linear", "half_pixel", None)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)  # float32 blends of 2 taps
