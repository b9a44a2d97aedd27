"""Conv2D's Winograd paths, F(2x2, 3x3) and F(4x4, 3x3), against a float64 reference and
onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels.base import Attrs, TensorSpec
from sporenet.lite.kernels.conv import Conv2D
from tests.unit.lite.onnx_reference import run_onnx_op
from tests.unit.lite.test_channels_last import stored
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, _data, conv_reference

# Strategy -> the size limits to lift so that small shapes take it.
FORCE = {
    "winograd": {
        "_WINOGRAD_MIN_PLANE": 0,
        "_WINOGRAD_MIN_CH": 1,
        "_WINOGRAD_SMALL_PLANE_MIN_CH": 1,
        "_WINOGRAD_MIN_WORK": 0,
        "_WINOGRAD4_MIN_TILES": 10**9,
        "_WINOGRAD4_MANY_TILES": 10**9,
    },
    "winograd4": {
        "_WINOGRAD_MIN_CH": 1,
        "_WINOGRAD_SMALL_PLANE_MIN_CH": 1,
        "_WINOGRAD4_MIN_TILES": 0,
    },
}


@pytest.mark.parametrize("strategy", sorted(FORCE))
@pytest.mark.parametrize(
    "n,c,h,w,o,pads",
    [
        (1, 32, 16, 16, 32, (1, 1, 1, 1)),  # the tile size divides the output: one store copy
        (2, 8, 10, 14, 12, (0, 0, 0, 0)),  # batch 2, no padding, non-square, O > C
        (1, 6, 9, 11, 5, (2, 0, 1, 1)),  # asymmetric pads, output 9x11: tiles overhang
        (1, 12, 7, 7, 4, (1, 1, 1, 1)),  # 7x7: the last tile row and column are cropped
        (3, 5, 13, 6, 7, (1, 2, 0, 1)),  # batch 3, odd sizes everywhere
    ],
)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_winograd_matches_reference_and_onnxruntime(
    monkeypatch, strategy, n, c, h, w, o, pads, bias, activation
):
    """Each path must match the float64 direct convolution and onnxruntime. F(4x4)'s
    rounding error scales with the output's magnitude (its transforms hold 4s, 5s and
    8s), so the absolute tolerance is 1e-5 of the largest output, besides the 1e-4
    relative tolerance per element."""
    from sporenet.lite.kernels import conv_strategy

    for name, value in FORCE[strategy].items():
        monkeypatch.setattr(conv_strategy, name, value)
    x, wt, b = _data(np.random.default_rng(12), n, c, h, w, o, 1, (3, 3), bias)
    inputs = [x, wt] + ([b] if bias else [])
    spec = [TensorSpec(a.shape, a.dtype, None if k == 0 else a) for k, a in enumerate(inputs)]
    assert Conv2D(Attrs("Conv", {"pads": list(pads)}), spec).strategy == strategy
    (ours,) = run_op(OpCode.CONV2D, inputs, pads=list(pads), activation=activation)
    ref = conv_reference(x, wt, b, pads=pads)
    (ort,) = run_onnx_op("Conv", inputs, initializers=range(1, len(inputs)), pads=list(pads))
    if activation == "relu":
        ref, ort = np.maximum(ref, 0), np.maximum(ort, 0)
    atol = max(ATOL, 1e-5 * float(np.abs(ref).max()))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=atol)
    np.testing.assert_allclose(ours, ort, rtol=RTOL, atol=atol)


def test_winograd4_error_stays_small_on_resnet_layers():
    """F(4x4)'s transforms hold 4s, 5s and 8s, so its float32 error grows with the channel
    count; on a ResNet layer (128 channels, 14x14) it must stay far below the runtime's
    1e-4 tolerance against onnxruntime."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 128, 14, 14)).astype(np.float32)
    wt = (rng.standard_normal((128, 128, 3, 3)) / np.sqrt(9 * 128)).astype(np.float32)
    spec = [TensorSpec(x.shape, x.dtype), TensorSpec(wt.shape, wt.dtype, wt)]
    assert Conv2D(Attrs("Conv", {"pads": [1, 1, 1, 1]}), spec).strategy == "winograd4"
    (ours,) = run_op(OpCode.CONV2D, [x, wt], pads=[1, 1, 1, 1])
    ref = conv_reference(x, wt, None, pads=(1, 1, 1, 1))
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 2e-5


@pytest.mark.parametrize("strategy", sorted(FORCE))
@pytest.mark.parametrize(
    "n,c,h,w,o",
    [
        (1, 16, 16, 16, 24),  # the tile size divides the output: one store copy
        (2, 8, 10, 14, 12),  # batch 2; 10x14 overhangs F(4x4) tiles (cropped store)
        (1, 12, 7, 9, 5),  # 7x9: both transforms crop the last tile row and column
    ],
)
@pytest.mark.parametrize("layout", ["nchw->last", "last->last", "last->nchw"])
# The tile rows per block: all at once, one, or two (the (2, 8, 10, 14, 12) case's five
# rows of F(2x2) tiles then end in a short block).
@pytest.mark.parametrize("block_bytes", [None, 1, 2 * 16 * 7 * 12 * 4])
def test_winograd_reads_and_writes_channels_last(
    monkeypatch, strategy, n, c, h, w, o, layout, block_bytes
):
    """Input and output may each be an NCHW view of channels-last memory (the planner's
    storage), and the tiles are taken in blocks of tile rows: the result is the float64
    reference's, with the bias and the fused activation applied, whatever the layouts
    and the blocks."""
    from sporenet.lite.kernels import conv_strategy, winograd

    for name, value in FORCE[strategy].items():
        monkeypatch.setattr(conv_strategy, name, value)
    if block_bytes is not None:
        monkeypatch.setattr(winograd, "BLOCK_BYTES", block_bytes)
    x, wt, b = _data(np.random.default_rng(14), n, c, h, w, o, 1, (3, 3), True)
    spec = [TensorSpec(x.shape, x.dtype), TensorSpec(wt.shape, wt.dtype, wt)]
    spec.append(TensorSpec(b.shape, b.dtype, b))
    kernel = Conv2D(Attrs("Conv", {"pads": [1, 1, 1, 1], "activation": "relu"}), spec)
    assert kernel.strategy == strategy
    in_last, out_last = (side == "last" for side in layout.split("->"))
    xs = stored(x, in_last)
    out = stored(np.full((n, o, h, w), np.nan, np.float32), out_last)
    step = kernel.bind([xs, wt.copy(), b], [out])
    for _ in range(2):  # a second call must not depend on what the first left behind
        step()
    ref = np.maximum(conv_reference(x, wt, b, pads=(1, 1, 1, 1)), 0)
    atol = max(ATOL, 1e-5 * float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=atol)
    assert out.transpose(0, 2, 3, 1).flags.c_contiguous == out_last


def test_winograd_prefers_channels_last_on_both_sides():
    """Winograd gathers and scatters its tiles channels-last, so the planner should store
    its input and output so; im2col does not write or read them that way by default."""
    from sporenet.lite.kernels.base import ChannelsLast

    x = TensorSpec((1, 48, 16, 40), np.dtype(np.float32))
    wt = np.zeros((192, 48, 3, 3), np.float32)
    kernel = Conv2D(Attrs("Conv", {"pads": [1, 1, 1, 1]}), [x, TensorSpec(wt.shape, wt.dtype, wt)])
    assert kernel.strategy == "winograd4"
    assert kernel.channels_last_input(0) == ChannelsLast.PREFERRED
    assert kernel.channels_last_output(0) == ChannelsLast.PREFERRED
