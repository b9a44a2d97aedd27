"""Depthwise convolution: both algorithms against the float64 reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels import depthwise
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from sporenet.lite.kernels.spatial import Window
from tests.unit.lite.onnx_reference import run_onnx_op
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, conv_reference

# (N, C, H, W, kernel, strides, dilations, pads)
SHAPES = [
    (1, 8, 9, 9, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (2, 8, 10, 9, (3, 3), (2, 2), (1, 1), (1, 0, 1, 1)),
    (1, 9, 11, 12, (3, 5), (2, 3), (2, 1), (2, 1, 0, 2)),
    (2, 10, 7, 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (1, 12, 8, 8, (3, 3), (1, 2), (1, 2), (0, 3, 1, 0)),  # pads past the kernel's reach
    (1, 16, 5, 6, (2, 3), (3, 1), (1, 1), (0, 0, 0, 0)),  # rows never read, no padding
    (1, 8, 3, 3, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # one output column per tap
    (1, 8, 2, 20, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # most kernel rows read padding
    (1, 8, 2, 6, (3, 3), (1, 1), (1, 1), (3, 1, 1, 1)),  # an output row of padding only
    (2, 8, 5, 7, (1, 1), (1, 1), (2, 2), (0, 0, 0, 0)),  # a per-channel scale and shift
]

# (_MIN_CHANNELS_LAST, _STRIDED_PLANAR_GRID) forcing each algorithm on every shape
ALGORITHMS = {"channels-last": (1, 10**9), "planar": (10**9, 0)}


@pytest.fixture(params=list(ALGORITHMS), ids=list(ALGORITHMS))
def algorithm(request, monkeypatch):
    min_channels, strided_grid = ALGORITHMS[request.param]
    monkeypatch.setattr(depthwise, "_MIN_CHANNELS_LAST", min_channels)
    monkeypatch.setattr(depthwise, "_STRIDED_PLANAR_GRID", strided_grid)
    return request.param


@pytest.mark.parametrize("constant", [True, False], ids=["const", "runtime"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}p{s[7]}")
def test_depthwise_matches_reference(algorithm, shape, bias, constant):
    n, c, h, w, k, strides, dilations, pads = shape
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32) if bias else None
    inputs = [x, wt] + ([b] if bias else [])
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=c)
    (ours,) = run_op(OpCode.CONV2D, inputs, constant_inputs=None if constant else [], **attrs)
    ref = conv_reference(x, wt, b, strides, dilations, pads, c)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize(
    "activation,fn",
    [
        ("relu6", lambda y: np.clip(y, 0, 6)),
        ("relu", lambda y: np.maximum(y, 0)),
    ],
)
def test_depthwise_matches_onnxruntime(algorithm, stride, activation, fn):
    """A MobileNet-style layer (3x3, pad 1, bias, fused activation) against onnxruntime."""
    rng = np.random.default_rng(6)
    x = (rng.normal(size=(1, 24, 12, 12)) * 3).astype(np.float32)
    wt = rng.normal(size=(24, 1, 3, 3)).astype(np.float32)
    b = rng.normal(size=24).astype(np.float32)
    attrs = dict(strides=[stride, stride], pads=[1, 1, 1, 1], group=24)
    (ours,) = run_op(OpCode.CONV2D, [x, wt, b], activation=activation, **attrs)
    (ort,) = run_onnx_op("Conv", [x, wt, b], initializers=[1, 2], **attrs)
    np.testing.assert_allclose(ours, fn(ort), rtol=RTOL, atol=ATOL)


def test_depthwise_bound_step_reuses_its_buffers(algorithm):
    """Repeated calls with new inputs and run-time weights: padding stays zero, nothing
    stale leaks from the previous call."""
    n, c, h, w = 2, 8, 7, 6
    specs = [
        TensorSpec((n, c, h, w), np.dtype(np.float32)),
        TensorSpec((c, 1, 3, 3), np.dtype(np.float32)),
        TensorSpec((c,), np.dtype(np.float32)),
    ]
    attrs = dict(strides=[2, 1], pads=[1, 1, 1, 1], group=c)
    kernel = Conv2D(Attrs("CONV2D", attrs), specs)
    x, wt, b = (np.empty(s.shape, np.float32) for s in specs)
    out = np.empty(kernel.output_specs[0].shape, np.float32)
    step = kernel.bind([x, wt, b], [out])
    rng = np.random.default_rng(7)
    for _ in range(3):
        for arr in (x, wt, b):
            arr[...] = rng.normal(size=arr.shape)
        step()
        ref = conv_reference(x, wt, b, (2, 1), (1, 1), (1, 1, 1, 1), c)
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}p{s[7]}")
def test_channels_last_with_weights_tiled_over_a_few_columns(monkeypatch, shape):
    # Large layers tile their weights over a divisor of OW instead of the whole row.
    monkeypatch.setattr(depthwise, "_MIN_CHANNELS_LAST", 1)
    monkeypatch.setattr(depthwise, "_STRIDED_PLANAR_GRID", 10**9)
    monkeypatch.setattr(depthwise, "_TILED_WEIGHTS_LIMIT", 0)
    monkeypatch.setattr(depthwise, "_MIN_BLOCK_RUN", 16)
    n, c, h, w, k, strides, dilations, pads = shape
    rng = np.random.default_rng(6)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=c)
    (ours,) = run_op(OpCode.CONV2D, [x, wt, b], **attrs)
    ref = conv_reference(x, wt, b, strides, dilations, pads, c)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("layouts", ["nchw", "channels-last"])
@pytest.mark.parametrize("shape", SHAPES[:5], ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}p{s[7]}")
def test_zero_constant_bias_is_skipped(algorithm, shape, layouts):
    # A constant all-zero bias (BlazeFace-style models fold their batch norms elsewhere)
    # is dropped at bind: the step never reads it, and the result is the unbiased one.
    n, c, h, w, k, strides, dilations, pads = shape
    rng = np.random.default_rng(10)
    value = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = np.zeros(c, np.float32)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=c)
    specs = [
        TensorSpec(value.shape, value.dtype),
        TensorSpec(wt.shape, wt.dtype, wt),
        TensorSpec(b.shape, b.dtype, b),
    ]
    kernel = Conv2D(Attrs("CONV2D", attrs), specs)
    o = kernel.output_specs[0].shape
    if layouts == "channels-last":
        x = np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
        out = np.empty((o[0], o[2], o[3], o[1]), np.float32).transpose(0, 3, 1, 2)
    else:
        x, out = np.empty(value.shape, np.float32), np.empty(o, np.float32)
    x[...] = value
    step = kernel.bind([x, wt, b], [out])
    b[...] = np.nan  # not read any more
    step()
    ref = conv_reference(value, wt, None, strides, dilations, pads, c)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


# Column-strided layers for the column-phase layout:
# (N, C, H, W, kernel, strides, dilations, pads)
PHASE_SHAPES = [
    (1, 8, 12, 12, (5, 5), (2, 2), (1, 1), (1, 1, 2, 2)),  # BlazeFace's 5x5 stride 2
    (2, 8, 11, 9, (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),  # TF "same": bottom/right only
    (1, 9, 11, 12, (3, 5), (2, 3), (1, 1), (2, 1, 0, 2)),  # stride 3: three phases
    (1, 16, 9, 9, (2, 4), (3, 2), (1, 1), (0, 3, 1, 0)),  # even kernel, no zero taps
    (1, 8, 12, 11, (5, 5), (2, 2), (1, 1), (4, 4, 4, 4)),  # pads past the kernel's reach
    (1, 8, 4, 40, (5, 5), (2, 2), (1, 1), (2, 2, 2, 2)),  # most kernel rows read padding
    (1, 8, 9, 10, (3, 3), (2, 2), (2, 1), (2, 1, 2, 1)),  # dilated rows
    (1, 8, 3, 3, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),  # one output column per phase
]


@pytest.mark.parametrize("layouts", ["nchw", "channels-last"])
@pytest.mark.parametrize("constant", [True, False], ids=["const", "runtime"])
@pytest.mark.parametrize("band_rows", [1, None], ids=["bands", "one-band"])
@pytest.mark.parametrize("shape", PHASE_SHAPES, ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}")
def test_column_phases_match_the_reference(monkeypatch, shape, band_rows, constant, layouts):
    # Every input column copied once into its phase, the taps past the kernel weighted
    # zero: on stale temporaries (NaN bytes), zeros must cover all that the copies leave.
    from sporenet.lite.kernels.workspace import active

    n, c, h, w, k, strides, dilations, pads = shape
    monkeypatch.setattr(depthwise, "_MIN_CHANNELS_LAST", 1)
    monkeypatch.setattr(depthwise, "_STRIDED_PLANAR_GRID", 10**9)
    monkeypatch.setattr(depthwise, "_PHASE_CALLS", -(10**9))  # phases at any size
    if band_rows is not None:
        monkeypatch.setattr(depthwise, "_BAND_BYTES", 1)
    used = []
    real = depthwise._phase_bands
    monkeypatch.setattr(depthwise, "_phase_bands", lambda *a: used.append(1) or real(*a))
    rng = np.random.default_rng(11)
    value = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=c)
    specs = [TensorSpec(value.shape, value.dtype)] + [
        TensorSpec(a.shape, a.dtype, a if constant else None) for a in (wt, b)
    ]
    kernel = Conv2D(Attrs("CONV2D", attrs), specs)
    o = kernel.output_specs[0].shape
    if layouts == "channels-last":
        x = np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
        out = np.empty((o[0], o[2], o[3], o[1]), np.float32).transpose(0, 3, 1, 2)
    else:
        x, out = np.empty(value.shape, np.float32), np.empty(o, np.float32)
    x[...] = value
    with active(_stale_workspace()):
        step = kernel.bind([x, wt, b], [out])
    assert used, "the column-phase layout did not run"
    for _ in range(2):  # the second call on the buffers the first one left
        step()
        ref = conv_reference(value, wt, b, strides, dilations, pads, c)
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


DIRECT_SHAPES = [
    *PHASE_SHAPES,
    (1, 8, 13, 17, (7, 7), (1, 3), (1, 2), (3, 3, 3, 3)),  # dilated columns
    (1, 8, 8, 8, (3, 3), (2, 2), (1, 1), (3, 1, 0, 3)),  # output rows of padding only
]


@pytest.mark.parametrize("out_last", [True, False], ids=["out-last", "out-nchw"])
@pytest.mark.parametrize("constant", [True, False], ids=["const", "runtime"])
@pytest.mark.parametrize("shape", DIRECT_SHAPES, ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}")
def test_column_strided_layers_read_channels_last_inputs_in_place(
    monkeypatch, shape, constant, out_last
):
    # One einsum per block of output pixels that read the same taps inside the input:
    # the padding is never read, and blocks reading none of the input are zeroed.
    from sporenet.lite.kernels.workspace import active

    n, c, h, w, k, strides, dilations, pads = shape
    monkeypatch.setattr(depthwise, "_MIN_CHANNELS_LAST", 1)
    monkeypatch.setattr(depthwise, "_DIRECT_MIN_CHANNELS", 1)
    used = []
    real = depthwise._bind_direct
    monkeypatch.setattr(depthwise, "_bind_direct", lambda *a, **k: used.append(1) or real(*a, **k))
    rng = np.random.default_rng(12)
    value = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=c)
    specs = [TensorSpec(value.shape, value.dtype)] + [
        TensorSpec(a.shape, a.dtype, a if constant else None) for a in (wt, b)
    ]
    kernel = Conv2D(Attrs("CONV2D", attrs), specs)
    o = kernel.output_specs[0].shape
    x = np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
    x[...] = value
    if out_last:
        out = np.empty((o[0], o[2], o[3], o[1]), np.float32).transpose(0, 3, 1, 2)
    else:
        out = np.empty(o, np.float32)
    with active(_stale_workspace()):
        step = kernel.bind([x, wt, b], [out])
    assert used, "the in-place reading did not run"
    out.fill(np.nan)
    step()
    ref = conv_reference(value, wt, b, strides, dilations, pads, c)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


def test_column_phases_chosen_by_cost():
    # A wide strided kernel copies its input kw/sw times as column-tap planes: phases
    # copy it once; a dilated kernel, or a 1x1 kernel of stride 2, keeps the planes.
    def win(k, s, d=1, hw=56, c=96):
        o = (hw + k - 1 - d * (k - 1) - 1) // s + 1
        pads = ((k - 1) * d // 2,) * 4
        window = Window((k, k), (s, s), (d, d), pads, (o, o))
        return depthwise.uses_column_phases(window, (1, c, hw, hw))

    assert win(5, 2) and win(3, 2, hw=112, c=64)
    assert not win(5, 2, d=2) and not win(1, 2) and not win(3, 1)
    assert not win(3, 2, hw=24, c=32)  # too small to pay for the extra calls


def _stale_workspace():
    """A workspace whose temporaries hold NaN bit patterns, as reused arena bytes may."""
    from sporenet.lite.kernels.workspace import Workspace

    return Workspace(lambda nbytes: np.full(nbytes, 0xFF, np.uint8))


@pytest.mark.parametrize("layouts", ["nchw", "channels-last"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}p{s[7]}")
def test_channels_last_on_stale_temporaries_with_fused_activation(algorithm, shape, layouts):
    # The padded buffer's frame is rewritten on every call (in two strided fills when
    # the margins allow), and the activation runs inside the step, before any copy out.
    from sporenet.lite.kernels.workspace import active

    n, c, h, w, k, strides, dilations, pads = shape
    rng = np.random.default_rng(8)
    value = (rng.normal(size=(n, c, h, w)) * 3).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(
        strides=list(strides),
        dilations=list(dilations),
        pads=list(pads),
        group=c,
        activation="hard_swish",
    )
    specs = [
        TensorSpec(value.shape, value.dtype),
        TensorSpec(wt.shape, wt.dtype, wt),
        TensorSpec(b.shape, b.dtype, b),
    ]
    kernel = Conv2D(Attrs("CONV2D", attrs), specs)
    shape_out = kernel.output_specs[0].shape
    if layouts == "channels-last":
        x = np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
        o = shape_out
        out = np.empty((o[0], o[2], o[3], o[1]), np.float32).transpose(0, 3, 1, 2)
    else:
        x, out = np.empty(value.shape, np.float32), np.empty(shape_out, np.float32)
    x[...] = value
    with active(_stale_workspace()):
        step = kernel.bind([x, wt, b], [out])
    step()
    ref = conv_reference(value, wt, b, strides, dilations, pads, c)
    want = ref * np.clip(ref / 6 + 0.5, 0, 1)
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[:4]}k{s[4]}s{s[5]}d{s[6]}p{s[7]}")
def test_column_strided_layers_in_bands_of_output_rows(monkeypatch, shape, rows):
    # Column-tap planes filled one band of output rows at a time, in a stale buffer the
    # bands share: every band rewrites its zeros (padding rows and columns) itself.
    from sporenet.lite.kernels.workspace import active

    n, c, h, w, k, strides, dilations, pads = shape
    monkeypatch.setattr(depthwise, "_MIN_CHANNELS_LAST", 1)
    monkeypatch.setattr(depthwise, "_STRIDED_PLANAR_GRID", 10**9)
    oh = (h + pads[0] + pads[2] - dilations[0] * (k[0] - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dilations[1] * (k[1] - 1) - 1) // strides[1] + 1
    row_bytes = n * strides[0] * k[1] * ow * c * 4
    monkeypatch.setattr(depthwise, "_BAND_BYTES", rows * row_bytes)
    rng = np.random.default_rng(9)
    value = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads), group=c)
    specs = [TensorSpec(value.shape, value.dtype), TensorSpec(wt.shape, wt.dtype, wt)]
    kernel = Conv2D(Attrs("CONV2D", attrs), [*specs, TensorSpec(b.shape, b.dtype, b)])
    out = np.empty(kernel.output_specs[0].shape, np.float32)
    assert out.shape[2:] == (oh, ow)
    with active(_stale_workspace()):
        step = kernel.bind([value, wt, b], [out])
    step()
    ref = conv_reference(value, wt, b, strides, dilations, pads, c)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("margin_rows", [True, False])
@pytest.mark.parametrize(
    "rows,cols", [((1, 5), (1, 7)), ((2, 4), (1, 6)), ((0, 6), (2, 8)), ((1, 6), (0, 7))]
)
def test_frame_fill_zeroes_exactly_the_margins(rows, cols, margin_rows):
    buf = np.full((2, 6, 8, 3), np.nan, np.float32)
    depthwise._frame_fill(buf, rows, cols, margin_rows=margin_rows)()
    (r0, r1), (c0, c1) = rows, cols
    inside = np.zeros(buf.shape, bool)
    inside[:, r0:r1, c0:c1] = True
    sides = np.zeros(buf.shape, bool)
    sides[:, r0:r1] = ~inside[:, r0:r1]
    assert np.isnan(buf[inside]).all()
    assert (buf[sides] == 0).all()
    # The margin rows are zeroed when asked; otherwise only the merged side runs may
    # reach into them (the right part of the row above, the left part of the row below).
    margin = ~inside & ~sides
    if margin_rows:
        assert (buf[margin] == 0).all()
    else:
        assert np.isnan(buf[:, :r0, :c1]).all() and np.isnan(buf[:, r1:, c0:]).all()


def test_channels_last_tiles_rewritten_every_call_and_kept_by_none(monkeypatch):
    # The tiled weights and bias live in the plan's arena, which other steps overwrite
    # between calls: every call rewrites them, and the step itself keeps no tile (a kept
    # tile would hold OW copies of the weights).
    import tracemalloc

    from sporenet.lite.kernels.workspace import Workspace, active

    monkeypatch.setattr(depthwise, "_MIN_CHANNELS_LAST", 1)
    n, c, h, w = 1, 16, 6, 64
    rng = np.random.default_rng(10)
    value = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, 5, 5)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(strides=[1, 1], dilations=[1, 1], pads=[2, 2, 2, 2], group=c)
    specs = [TensorSpec(value.shape, value.dtype), TensorSpec(wt.shape, wt.dtype, wt)]
    kernel = Conv2D(Attrs("CONV2D", attrs), [*specs, TensorSpec(b.shape, b.dtype, b)])
    out = np.empty(kernel.output_specs[0].shape, np.float32)
    blocks = [np.empty(1 << 18, np.uint8) for _ in range(8)]
    free = list(blocks)
    tracemalloc.start()
    with active(Workspace(lambda nbytes: free.pop()[:nbytes])):
        step = kernel.bind([value, wt, b], [out])
    kept, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert kernel.strategy == "depthwise" and len(free) < len(blocks)
    assert kept < 5 * 5 * w * c * 4 // 2  # far below one weight tile over the row
    ref = conv_reference(value, wt, b, (1, 1), (1, 1), (2, 2, 2, 2), c)
    for _ in range(2):
        for block in blocks:
            block.fill(0xFF)  # NaN bit patterns, as other steps' data may leave
        step()
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 144, 14, 14, (3, 3), (1, 1)),  # the bias tile spans a few output rows
        (1, 8, 3, 1031, (3, 3), (1, 1)),  # prime OW: whole output rows
        (2, 24, 9, 13, (5, 5), (2, 2)),  # batch 2, column phases
        (1, 160, 9, 9, (3, 3), (2, 2)),  # read in place from a channels-last input
    ],
    ids=str,
)
@pytest.mark.parametrize("constant", [True, False], ids=["const", "runtime"])
def test_bias_tile_covers_every_pixel(shape, constant):
    # The bias is tiled over a divisor of OH*OW pixels and rewritten on every call, so
    # a run-time bias changed between calls is read again.
    n, c, h, w, k, strides = shape
    pads = [k[0] // 2] * 4
    rng = np.random.default_rng(c + w)
    value = rng.normal(size=(n, c, h, w)).astype(np.float32)
    wt = rng.normal(size=(c, 1, *k)).astype(np.float32)
    b = rng.normal(size=c).astype(np.float32)
    attrs = dict(strides=list(strides), dilations=[1, 1], pads=pads, group=c)
    specs = [
        TensorSpec(value.shape, value.dtype),
        TensorSpec(wt.shape, wt.dtype, wt),
        TensorSpec(b.shape, b.dtype, b.copy() if constant else None),
    ]
    kernel = Conv2D(Attrs("CONV2D", attrs), specs)
    o = kernel.output_specs[0].shape
    x = np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
    out = np.empty((o[0], o[2], o[3], o[1]), np.float32).transpose(0, 3, 1, 2)
    x[...] = value
    step = kernel.bind([x, wt, b], [out])
    for call in range(2):
        step()
        ref = conv_reference(value, wt, b, strides, (1, 1), pads, c)
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
        if constant:
            break
        b[...] = rng.normal(size=c).astype(np.float32) + call
