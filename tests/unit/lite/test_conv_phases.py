"""Conv2D's strided im2col through stride phases (`phase_im2col_copies`)."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels import im2col
from sporenet.lite.kernels.im2col import im2col_view, phase_im2col_copies
from sporenet.lite.kernels.spatial import Window
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, _data, conv_reference


@pytest.mark.parametrize(
    "n,c,h,w,o,group,k,strides,pads",
    [
        (1, 3, 23, 23, 8, 1, (7, 7), (2, 2), (3, 3, 3, 3)),  # a ResNet stem, odd input
        (1, 3, 17, 16, 4, 1, (3, 3), (2, 2), (0, 0, 0, 0)),  # a SqueezeNet stem, unpadded
        (2, 4, 11, 13, 6, 2, (3, 2), (3, 2), (1, 0, 2, 1)),  # groups, batch 2, asymmetric
        (1, 2, 10, 9, 3, 1, (2, 2), (3, 3), (0, 1, 1, 0)),  # stride larger than the kernel
        (1, 5, 12, 12, 7, 1, (5, 1), (2, 1), (2, 0, 2, 0)),  # strided along rows only
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_strided_convolutions_match_reference(n, c, h, w, o, group, k, strides, pads, bias):
    x, wt, b = _data(np.random.default_rng(14), n, c, h, w, o, group, k, bias)
    inputs = [x, wt] + ([b] if bias else [])
    (ours,) = run_op(OpCode.CONV2D, inputs, strides=list(strides), pads=list(pads), group=group)
    ref = conv_reference(x, wt, b, strides, (1, 1), pads, group)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def test_phase_copies_fill_the_same_columns_as_the_direct_view():
    """Bit-identical columns: the phase route only reorders the copying."""
    xp = np.random.default_rng(15).normal(size=(2, 3, 13, 12)).astype(np.float32)
    win = Window(kernel=(3, 4), strides=(2, 3), dilations=(1, 1), pads=(0, 0, 0, 0), out=(6, 3))
    direct = np.array(im2col_view(xp, win))
    cols = np.full(direct.shape, np.nan, np.float32)
    for dst, src in phase_im2col_copies(xp, win, cols):
        np.copyto(dst, src)
    np.testing.assert_array_equal(cols, direct)


@pytest.mark.parametrize(
    "c,h,w,o,k,strides,dilations,pads",
    [
        (16, 23, 17, 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),  # last block shorter
        (16, 23, 17, 8, (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),  # dilated
        (8, 30, 9, 24, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0)),  # unpadded
        (1, 1, 640, 12, (1, 256), (1, 128), (1, 1), (0, 0, 0, 0)),  # long stride, no phases
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_im2col_in_blocks_of_output_rows_matches_reference(
    monkeypatch, c, h, w, o, k, strides, dilations, pads, bias
):
    # Large column matrices are built a few output rows at a time (_BLOCK_BYTES).
    monkeypatch.setattr(im2col, "_BLOCK_BYTES", 2000)
    x, wt, b = _data(np.random.default_rng(16), 1, c, h, w, o, 1, k, bias)
    inputs = [x, wt] + ([b] if bias else [])
    attrs = dict(strides=list(strides), dilations=list(dilations), pads=list(pads))
    (ours,) = run_op(OpCode.CONV2D, inputs, **attrs)
    ref = conv_reference(x, wt, b, strides, dilations, pads, 1)
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("out_last", [False, True], ids=["nchw", "channels-last"])
@pytest.mark.parametrize("bias", [True, False])
# Output rows per column block: all ten, one, or four (a short last block of two).
@pytest.mark.parametrize("block_rows", [None, 1, 4])
def test_wide_phase_rows_ignore_stale_temporaries(monkeypatch, out_last, bias, block_rows):
    # One image through the stride phases in whole rows (`_bind_wide_phases`), in blocks
    # of output rows: its temporaries come from a shared arena, here filled with NaN bit
    # patterns, and only dropped columns may read what the copies leave unwritten.
    from sporenet.lite.eager import prepare_kernel
    from sporenet.lite.kernels.base import TensorSpec
    from sporenet.lite.kernels.workspace import Workspace, active

    x, wt, b = _data(np.random.default_rng(15), 1, 3, 19, 22, 8, 1, (3, 3), bias)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    specs = [TensorSpec(a.shape, a.dtype, a) for a in [x, wt] + ([b] if bias else [])]
    specs[0] = TensorSpec(x.shape, x.dtype)
    kernel = prepare_kernel(OpCode.CONV2D, attrs, specs, 1)
    assert kernel.strategy == "im2col"
    if block_rows is not None:  # 27 (+1) column rows of 12-element phase rows
        monkeypatch.setattr(im2col, "_WIDE_BLOCK_BYTES", block_rows * (27 + bias) * 12 * 4)
    shape = kernel.output_specs[0].shape
    if out_last:
        out = np.empty((shape[0], *shape[2:], shape[1]), np.float32).transpose(0, 3, 1, 2)
    else:
        out = np.empty(shape, np.float32)
    with active(Workspace(lambda nbytes: np.full(nbytes, 0xFF, np.uint8))):
        step = kernel.bind([x, wt] + ([b] if bias else []), [out])
    with np.errstate(all="raise"):
        step()
    ref = conv_reference(x, wt, b, (2, 2), (1, 1), (1, 1, 1, 1), 1)
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
