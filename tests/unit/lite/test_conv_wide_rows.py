"""Conv2D's wide-row path (lite/kernels/im2col_wide.py) and the filter gradient's
against float64 references: stride-1 windows over a batch, padded or not, dilated,
asymmetric pads; the forward with a constant, a run-time or no bias, and a product split
into column blocks."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels import conv_common, im2col, im2col_wide
from sporenet.lite.kernels.training import conv_grad
from tests.unit.lite.test_kernels_conv import ATOL, RTOL, conv_reference

rng = np.random.default_rng(11)

CASES = {
    # name: (x shape, w shape, pads [top, left, bottom, right], dilations)
    "same 3x3": ((3, 8, 7, 9), (4, 8, 3, 3), [1, 1, 1, 1], [1, 1]),
    "valid 3x3": ((2, 6, 8, 5), (3, 6, 3, 3), [0, 0, 0, 0], [1, 1]),
    "5x3 asymmetric pads": ((2, 4, 9, 10), (5, 4, 5, 3), [2, 0, 1, 2], [1, 1]),
    "dilated": ((2, 4, 11, 12), (3, 4, 3, 3), [2, 2, 2, 2], [2, 2]),
    "wide dilation only": ((2, 3, 6, 13), (2, 3, 2, 3), [0, 1, 1, 0], [1, 3]),
}


@pytest.fixture
def wide_calls(monkeypatch):
    """The real wide-row binds, each recorded as whether a bias rode in its GEMM (each
    case must take the path it checks)."""
    calls: list[bool] = []
    real = im2col_wide.bind_wide_rows

    def counted(*args, **kwargs):
        calls.append(args[4] is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(im2col, "bind_wide_rows", counted)
    return calls


@pytest.mark.parametrize("bias", ["none", "run-time", "constant"])
@pytest.mark.parametrize("name", list(CASES))
def test_wide_rows_match_direct_convolution(name, bias, wide_calls, monkeypatch):
    xs, ws, pads, dilations = CASES[name]
    # A run-time bias rides in the GEMM only over columns built in blocks of images
    # (im2col.in_image_blocks), which these small batches reach with a tiny budget.
    monkeypatch.setattr(im2col, "_BLOCK_BYTES", 1)
    x = rng.normal(size=xs).astype(np.float32)
    w = rng.normal(size=ws).astype(np.float32)
    b = rng.normal(size=ws[0]).astype(np.float32)
    inputs = [x, w] if bias == "none" else [x, w, b]
    constant = [1, 2] if bias == "constant" else []
    (ours,) = run_op(
        OpCode.CONV2D, inputs, constant_inputs=constant, pads=pads, dilations=dilations
    )
    ref = conv_reference(x, w, None if bias == "none" else b, pads=pads, dilations=dilations)
    assert wide_calls == [bias != "none"], "the layer did not take the wide-row path"
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def test_wide_rows_split_into_column_blocks(monkeypatch, wide_calls):
    # A limit below one image's product splits it into column blocks of the output rows.
    x = rng.normal(size=(3, 8, 6, 7)).astype(np.float32)
    w = rng.normal(size=(4, 8, 3, 3)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    monkeypatch.setattr(im2col, "_BLOCK_BYTES", 1)  # the bias rides in the GEMM
    work = 4 * (8 * 9 + 1) * 6 * 9  # O * (K + 1) * OH * Wp
    monkeypatch.setattr(conv_common, "UNPACKED_GEMM", work // 3)
    assert conv_common.unpacked_parts(work) == 3
    (ours,) = run_op(OpCode.CONV2D, [x, w, b], pads=[1, 1, 1, 1])
    assert wide_calls == [True]
    ref = conv_reference(x, w, b, pads=(1, 1, 1, 1))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def test_one_input_channel_keeps_exact_columns(wide_calls):
    # 9 column rows against 16 output channels: dropping the extra columns would cost
    # more than the longer runs save, so the exact (OH, OW) columns stay.
    x = rng.normal(size=(2, 1, 8, 8)).astype(np.float32)
    w = rng.normal(size=(16, 1, 3, 3)).astype(np.float32)
    (ours,) = run_op(OpCode.CONV2D, [x, w], pads=[1, 1, 1, 1])
    assert not wide_calls
    ref = conv_reference(x, w, pads=(1, 1, 1, 1))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def filter_gradient_reference(g, x, w_shape, pads, dilations):
    """dW in float64: per tap, g against the shifted padded input."""
    _, _, kh, kw = w_shape
    (dh, dw), (oh, ow) = dilations, g.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out = np.zeros(w_shape)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh : i * dh + oh, j * dw : j * dw + ow]
            out[:, :, i, j] = np.einsum("nohw,nchw->oc", g.astype(np.float64), patch)
    return out


@pytest.fixture
def wide_filter_calls(monkeypatch):
    """The real wide-row filter-gradient binds, counted."""
    calls: list[int] = []
    real = conv_grad.Conv2DBackpropFilter._bind_wide_rows

    def counted(self, *args):
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(conv_grad.Conv2DBackpropFilter, "_bind_wide_rows", counted)
    return calls


def _filter_gradient(xs, ws, pads, dilations):
    """(ours, float64 reference) for random x and g of a stride-1 window."""
    x = rng.normal(size=xs).astype(np.float32)
    (dh, dw), (_, _, kh, kw) = dilations, ws
    oh = xs[2] + pads[0] + pads[2] - dh * (kh - 1)
    ow = xs[3] + pads[1] + pads[3] - dw * (kw - 1)
    g = rng.normal(size=(xs[0], ws[0], oh, ow)).astype(np.float32)
    w = np.zeros(ws, np.float32)  # lends its shape only
    (ours,) = run_op(OpCode.CONV2D_BACKPROP_FILTER, [g, x, w], pads=pads, dilations=dilations)
    return ours, filter_gradient_reference(g, x, ws, pads, dilations)


FILTER_CASES = {
    # name: (x shape, w shape, pads, dilations); 8+ input channels, rows wide enough
    "same 3x3": ((3, 8, 12, 11), (4, 8, 3, 3), [1, 1, 1, 1], [1, 1]),
    "valid 3x3": ((2, 9, 14, 15), (3, 9, 3, 3), [0, 0, 0, 0], [1, 1]),
    "5x3 asymmetric pads": ((2, 8, 13, 16), (5, 8, 5, 3), [2, 0, 1, 2], [1, 1]),
    "dilated": ((2, 8, 15, 24), (3, 8, 3, 3), [2, 2, 2, 2], [2, 2]),
}


@pytest.mark.parametrize("name", list(FILTER_CASES))
def test_filter_gradient_in_wide_rows(name, monkeypatch, wide_filter_calls):
    monkeypatch.setattr(conv_grad, "_WIDE_BLOCK_BYTES", 1)  # blocks of one image
    ours, ref = _filter_gradient(*FILTER_CASES[name])
    assert wide_filter_calls, "the gradient did not take the wide-row path"
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


def test_small_maps_keep_exact_filter_gradient_columns(wide_filter_calls):
    # An 8x8 map padded to 10x10 would run the product over a fifth more positions.
    ours, ref = _filter_gradient((2, 8, 8, 8), (4, 8, 3, 3), [1, 1, 1, 1], (1, 1))
    assert not wide_filter_calls
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("bias", [False, True])
def test_wide_rows_product_over_blocks_of_images(monkeypatch, wide_calls, bias):
    # 5 images in blocks of 2: each block is one product over its images' columns, the
    # last block (one image) a shorter one at the start of the same buffers.
    x = rng.normal(size=(5, 8, 6, 7)).astype(np.float32)
    w = rng.normal(size=(4, 8, 3, 3)).astype(np.float32)
    b = rng.normal(size=4).astype(np.float32)
    monkeypatch.setattr(im2col, "_BLOCK_BYTES", 1)  # a run-time bias rides in the GEMM
    rows = 8 * 9 + bias
    monkeypatch.setattr(im2col_wide, "_BLOCK_BYTES", 2 * rows * 6 * 9 * 4)  # 2 images
    inputs = [x, w, b] if bias else [x, w]
    (ours,) = run_op(OpCode.CONV2D, inputs, constant_inputs=[], pads=[1, 1, 1, 1])
    assert wide_calls == [bias]
    ref = conv_reference(x, w, b if bias else None, pads=(1, 1, 1, 1))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("bias", [False, True])
def test_filter_gradient_product_over_blocks_of_images(monkeypatch, wide_filter_calls, bias):
    # 5 images in blocks of 2 (the last one image): one product per block, summed.
    xs, ws, pads = (5, 8, 12, 11), (4, 8, 3, 3), [1, 1, 1, 1]
    rows = 8 * 9 + bias
    monkeypatch.setattr(conv_grad, "_WIDE_BLOCK_BYTES", 2 * rows * 12 * 13 * 4)
    x = rng.normal(size=xs).astype(np.float32)
    g = rng.normal(size=(5, 4, 12, 11)).astype(np.float32)
    w = np.zeros(ws, np.float32)
    outs = run_op(OpCode.CONV2D_BACKPROP_FILTER, [g, x, w], num_outputs=1 + bias, pads=pads)
    assert wide_filter_calls
    ref = filter_gradient_reference(g, x, ws, pads, (1, 1))
    np.testing.assert_allclose(outs[0], ref, rtol=RTOL, atol=ATOL)
    if bias:
        np.testing.assert_allclose(outs[1], g.astype(np.float64).sum(axis=(0, 2, 3)), rtol=1e-5)
