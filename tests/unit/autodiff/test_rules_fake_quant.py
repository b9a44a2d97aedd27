"""FAKE_QUANT: the forward grid equals the converter's int8 quantize-dequantize, and the
straight-through gradient equals finite differences of clip(x, min, max) (its surrogate)
inside the range and is zero outside."""

from __future__ import annotations

import numpy as np

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels.fake_quant import grid
from tests.unit.autodiff.gradcheck import GradientCase, rand


def _int8_reference(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Asymmetric int8 quantize-dequantize with integers, as an int8 kernel sees x."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / 255)
    zero_point = int(np.clip(np.rint(-128 - lo / float(scale)), -128, 127))
    q = np.clip(np.rint(x.astype(np.float64) / scale) + zero_point, -128, 127).astype(np.int64)
    return ((q - zero_point) * np.float64(scale)).astype(np.float32)


def test_forward_is_the_int8_grid_of_the_range():
    x = rand(4, 50, seed=1, scale=2.0)
    for lo, hi in ((-1.0, 1.5), (0.0, 3.0), (0.3, 2.0), (-2.5, -0.5)):
        (y,) = run_op(OpCode.FAKE_QUANT, [x, np.float32(lo), np.float32(hi)])
        ref = _int8_reference(x, lo, hi)
        step = (max(hi, 0) - min(lo, 0)) / 255
        # Same grid points (float rounding of the dequantized values aside); x / scale in
        # float32 against float64 may pick the other neighbour only at near-ties.
        same = np.isclose(y, ref, rtol=0, atol=step * 1e-3)
        assert np.mean(same) > 0.99 and np.max(np.abs(y - ref)) <= step * 1.001
        assert len(np.unique(y)) <= 256


def test_symmetric_weights_use_per_channel_absmax_over_127():
    w = rand(6, 3, 3, 3, seed=2)
    (y,) = run_op(OpCode.FAKE_QUANT, [w], narrow_range=1)
    scale = np.abs(w).reshape(6, -1).max(axis=1) / 127
    q = np.rint(w / scale[:, None, None, None])
    assert np.abs(q).max() == 127
    np.testing.assert_allclose(y, q * scale[:, None, None, None], rtol=1e-6, atol=1e-7)


def test_ste_gradient_matches_finite_differences_of_the_clamp():
    # 16 bits: the forward equals clip(x, lo, hi) to ~1e-5, so the loss gradient at the
    # fake-quantized output equals the clamp's; finite differences of the clamp are taken
    # in NumPy (the fake-quantized loss itself is piecewise constant).
    x = rand(3, 40, seed=3, scale=1.5)
    params = {"lo": np.array(-1.0, np.float32), "hi": np.array(0.8, np.float32)}

    def build(b, x, lo, hi):
        return b.op(OpCode.FAKE_QUANT, [x, lo, hi], num_bits=16)

    case = GradientCase(build, {"x": x}, params, wrt=["x", "lo", "hi"])
    grads = case.gradients()
    target = case.target.astype(np.float64)

    def loss(xv, lo, hi):
        return np.mean((np.clip(xv.astype(np.float64), lo, hi) - target) ** 2)

    h = 1e-4
    inside = (x > -1.0) & (x < 0.8)
    fd_x = np.zeros(x.size)
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = h
        fd_x[i] = (
            loss(x + e.reshape(x.shape), -1.0, 0.8) - loss(x - e.reshape(x.shape), -1.0, 0.8)
        ) / (2 * h)
    np.testing.assert_allclose(grads["x"].reshape(-1), fd_x, rtol=1e-3, atol=1e-5)
    assert np.all(grads["x"][~inside] == 0) and np.any(grads["x"][inside] != 0)
    fd_lo = (loss(x, -1.0 + h, 0.8) - loss(x, -1.0 - h, 0.8)) / (2 * h)
    fd_hi = (loss(x, -1.0, 0.8 + h) - loss(x, -1.0, 0.8 - h)) / (2 * h)
    np.testing.assert_allclose(grads["lo"], fd_lo, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(grads["hi"], fd_hi, rtol=1e-3, atol=1e-5)


def test_per_channel_ranges_and_symmetric_weights_pass_gradients_through():
    w = rand(4, 5, seed=4)
    lo = np.array([-0.5, -1.0, -0.2, -2.0], np.float32)
    hi = -lo
    (y,) = run_op(OpCode.FAKE_QUANT, [w, lo, hi], axis=0)
    assert np.all(np.abs(y) <= hi[:, None] * 1.01)
    g = rand(4, 5, seed=5)
    dx, dlo, dhi = run_op(OpCode.FAKE_QUANT_GRAD, [g, w, lo, hi], num_outputs=3, axis=0)
    _, nlo, nhi = grid(lo, hi, 8, False)
    below, above = w < nlo[:, None], w > nhi[:, None]
    np.testing.assert_array_equal(dx, np.where(below | above, 0, g))
    np.testing.assert_allclose(dlo, np.where(below, g, 0).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(dhi, np.where(above, g, 0).sum(axis=1), rtol=1e-6)
    (dx_sym,) = run_op(OpCode.FAKE_QUANT_GRAD, [g, w], narrow_range=1)
    np.testing.assert_array_equal(dx_sym, g)
