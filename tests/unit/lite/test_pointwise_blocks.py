"""The channels-last 1x1 GEMM run in blocks of rows (pointwise._bind_row_blocks) against
a float64 reference, at shapes that take it and with every epilogue it carries."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels import pointwise
from sporenet.lite.kernels.activation import FUSED_ACTIVATIONS
from sporenet.lite.opset.decl import Activation
from sporenet.lite.threads import BLAS

# float32 products sum in another order than the float64 reference: 1e-5 relative (plus
# a small absolute term for sums near zero) is far above that and far below any
# misplaced block or bias.
RTOL, ATOL = 1e-5, 1e-5


def _stored(shape: tuple[int, ...], channels_last: bool, rng: np.random.Generator) -> np.ndarray:
    """A normal (N, C, H, W) array, stored channels-last or NCHW."""
    n, c, h, w = shape
    if channels_last:
        return rng.normal(size=(n, h, w, c)).astype(np.float32).transpose(0, 3, 1, 2)
    return rng.normal(size=shape).astype(np.float32)


def _reference(x, w, bias, act):
    out = np.einsum("nchw,oc->nohw", x.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    if act == Activation.RELU6:
        out = np.clip(out, 0, 6)
    elif act == Activation.RELU:
        out = np.maximum(out, 0)
    return out


# (N, C, H, W, O, input channels-last): outputs above the blocking threshold, with row
# counts that are and are not whole numbers of blocks and of bias tiles.
SHAPES = [
    (1, 32, 96, 96, 32, True),
    (1, 16, 112, 112, 64, True),
    (1, 24, 61, 67, 96, True),  # rows not a multiple of the block or the bias tile
    (2, 40, 50, 50, 48, True),  # batch 2: the rows of both images in one matrix
    (1, 16, 112, 112, 64, False),  # NCHW input: transposed blocks
    (1, 24, 57, 59, 72, False),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", ["none", "constant", "run-time"])
@pytest.mark.parametrize("act", [Activation.NONE, Activation.RELU6])
def test_row_blocks_match_the_reference(monkeypatch, shape, bias, act):
    n, c, h, wd, o, x_last = shape
    if not x_last and (n != 1 or c < pointwise._MIN_BLOCKED_NCHW_CHANNELS):
        pytest.skip("not a shape the blocks take")
    calls = []
    original = pointwise._bind_row_blocks

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(pointwise, "_bind_row_blocks", spy)
    rng = np.random.default_rng(c * h + o)
    x = _stored((n, c, h, wd), x_last, rng)
    w = rng.normal(size=(o, c, 1, 1)).astype(np.float32)
    b = None if bias == "none" else rng.normal(size=o).astype(np.float32)
    out = np.empty((n, h, wd, o), np.float32).transpose(0, 3, 1, 2)
    step = pointwise.bind_pointwise_last(x, w, out, b, bias == "constant", FUSED_ACTIVATIONS[act])
    assert calls == [(n * h * wd, c)]
    for seed in range(2):  # a run-time bias is read on every call
        if bias == "run-time":
            b[:] = np.random.default_rng(seed).normal(size=o)
        with BLAS.limit(1):  # the blocks run only on one BLAS thread
            step()
        np.testing.assert_allclose(out, _reference(x, w, b, act), rtol=RTOL, atol=ATOL)


class _TwoThreads:
    """Stands in for lite.threads.BLAS with a pool of two threads."""

    available = True

    @staticmethod
    def get() -> int:
        return 2


def test_row_blocks_run_one_product_on_several_blas_threads(monkeypatch):
    rng = np.random.default_rng(3)
    x = _stored((1, 32, 96, 96), True, rng)
    w = rng.normal(size=(32, 32, 1, 1)).astype(np.float32)
    b = rng.normal(size=32).astype(np.float32)
    out = np.empty((1, 96, 96, 32), np.float32).transpose(0, 3, 1, 2)
    monkeypatch.setattr(pointwise, "BLAS", _TwoThreads())
    step = pointwise.bind_pointwise_last(x, w, out, b, True, FUSED_ACTIVATIONS[Activation.RELU])
    step()
    np.testing.assert_allclose(out, _reference(x, w, b, Activation.RELU), rtol=RTOL, atol=ATOL)


def test_small_outputs_keep_one_product(monkeypatch):
    calls = []
    monkeypatch.setattr(pointwise, "_bind_row_blocks", lambda *a, **k: calls.append(a))
    rng = np.random.default_rng(4)
    x = _stored((1, 64, 24, 24), True, rng)
    w = rng.normal(size=(64, 64, 1, 1)).astype(np.float32)
    out = np.empty((1, 24, 24, 64), np.float32).transpose(0, 3, 1, 2)
    step = pointwise.bind_pointwise_last(x, w, out, None, False, None)
    step()
    assert calls == []
    np.testing.assert_allclose(out, _reference(x, w, None, None), rtol=RTOL, atol=ATOL)
