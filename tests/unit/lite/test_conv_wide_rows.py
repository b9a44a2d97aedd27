"""Conv2D's wide-row path (lite/kernels/im2col_wide.py) against a float64 direct
convolution: stride-1 windows over a batch, padded or not, dilated, asymmetric pads,
with a constant, a run-time or no bias, and a product split into column blocks."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels import conv_common, im2col, im2col_wide
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
