"""Softmax, LogSoftmax and LayerNorm against NumPy references and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode, ShapeError
from sporenet.lite.eager import run_op
from tests.unit.lite.onnx_reference import run_onnx_op

AXES_CASES = [
    ((5,), 0),
    ((3, 7), -1),
    ((3, 7), 0),
    ((2, 3, 4, 5), 1),
    ((2, 3, 4, 5), -2),
    ((2, 3, 4, 5), 3),
]


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize(("shape", "axis"), AXES_CASES, ids=str)
def test_softmax_and_log_softmax(shape, axis):
    x = np.random.default_rng(0).normal(scale=3, size=shape).astype(np.float32)
    ref = _softmax64(x.astype(np.float64), axis)
    (sm,) = run_op(OpCode.SOFTMAX, [x], axis=axis)
    (lsm,) = run_op(OpCode.LOG_SOFTMAX, [x], axis=axis)
    # float32 exp/sum: relative error of a few ulp per element.
    np.testing.assert_allclose(sm, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(lsm, np.log(ref), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sm, run_onnx_op("Softmax", [x], axis=axis)[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        lsm, run_onnx_op("LogSoftmax", [x], axis=axis)[0], rtol=1e-5, atol=1e-5
    )


def test_softmax_default_axis_is_last():
    x = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
    (sm,) = run_op(OpCode.SOFTMAX, [x])
    np.testing.assert_allclose(sm.sum(axis=-1), 1, rtol=1e-6)


def test_softmax_is_stable_for_huge_logits():
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e30, 0.0, 1e30]], np.float32)
    with np.errstate(over="raise", invalid="raise"):  # underflow of exp to 0 is fine
        (sm,) = run_op(OpCode.SOFTMAX, [x])
        (lsm,) = run_op(OpCode.LOG_SOFTMAX, [x])
    np.testing.assert_allclose(sm, [[0.5, 0.5, 0], [0, 0, 1]], atol=1e-7)
    np.testing.assert_allclose(lsm[0, :2], np.log(0.5), rtol=1e-6)
    assert np.isfinite(lsm).all()
    assert lsm[1, 2] == 0


@pytest.mark.parametrize("op", [OpCode.SOFTMAX, OpCode.LOG_SOFTMAX])
def test_softmax_errors(op):
    with pytest.raises(ShapeError, match=r"axis 2 is out of range for rank 2 \(expected -2..1\)"):
        run_op(op, [np.zeros((2, 3), np.float32)], axis=2)
    with pytest.raises(ShapeError, match="input 0 must be a float tensor, got int64"):
        run_op(op, [np.zeros((2, 3), np.int64)])
    with pytest.raises(ShapeError, match="rank >= 1"):
        run_op(op, [np.float32(1)])


# --------------------------------------------------------------------------- LayerNorm


def _layer_norm64(x, scale, bias, axis, eps):
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    y = (x - mean) * inv * scale
    return (y if bias is None else y + bias), mean, inv


LN_CASES = [
    ((4, 8), -1, True),
    ((2, 5, 6), -1, False),
    ((2, 5, 6), 1, True),
    ((2, 3, 4, 5), -3, True),
    ((3, 7), 0, True),
]


@pytest.mark.parametrize(("shape", "axis", "with_bias"), LN_CASES, ids=str)
def test_layer_norm(shape, axis, with_bias):
    rng = np.random.default_rng(2)
    x = (rng.normal(size=shape) * 4 + 3).astype(np.float32)
    norm_shape = shape[axis % len(shape) :]
    scale = rng.normal(size=norm_shape).astype(np.float32)
    bias = rng.normal(size=norm_shape).astype(np.float32) if with_bias else None
    eps = 1e-3
    inputs = [x, scale] + ([bias] if with_bias else [])
    y, mean, inv = run_op(OpCode.LAYER_NORM, inputs, num_outputs=3, axis=axis, epsilon=eps)
    ry, rmean, rinv = _layer_norm64(x.astype(np.float64), scale, bias, axis, eps)
    # float32 mean/variance over up to 60 elements: ~1e-6 relative error.
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, rmean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv, rinv, rtol=1e-5)
    theirs = run_onnx_op(
        "LayerNormalization", inputs, num_outputs=3, initializers=[1, 2], axis=axis, epsilon=eps
    )
    for a, b in zip((y, mean, inv), theirs, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_layer_norm_one_output_and_broadcast_scale():
    x = np.random.default_rng(3).normal(size=(2, 3, 4)).astype(np.float32)
    scale = np.full((1, 4), 2.0, np.float32)  # broadcasts to the normalized shape [3, 4]
    (y,) = run_op(OpCode.LAYER_NORM, [x, scale, None], axis=1)
    ry, _, _ = _layer_norm64(x.astype(np.float64), 2.0, None, 1, 1e-5)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-5)


def test_layer_norm_errors():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(
        ShapeError,
        match=r"scale of shape \[3\] does not broadcast to the "
        r"normalized shape \[4\]",
    ):
        run_op(OpCode.LAYER_NORM, [x, np.ones(3, np.float32)])
    with pytest.raises(ShapeError, match=r"bias of shape \[2, 4\] does not broadcast"):
        run_op(OpCode.LAYER_NORM, [x, np.ones(4, np.float32), np.ones((2, 4), np.float32)])
    with pytest.raises(ShapeError, match="scale must be float32 like x, got float64"):
        run_op(OpCode.LAYER_NORM, [x, np.ones(4)])
    with pytest.raises(ShapeError, match="axis 3 is out of range for rank 3"):
        run_op(OpCode.LAYER_NORM, [x, np.ones(4, np.float32)], axis=3)
    with pytest.raises(ShapeError, match="input 1 is required"):
        run_op(OpCode.LAYER_NORM, [x, None])


@pytest.mark.parametrize(("shape", "axis"), [((32, 192), -1), ((2, 5, 7), 1), ((1, 20, 336), 2)])
def test_layer_norm_is_the_numpy_mean_formula_bit_for_bit(shape, axis):
    # The step skips np.mean's wrapper; its sum and division by the count are np.mean's.
    rng = np.random.default_rng(5)
    x = rng.normal(size=shape).astype(np.float32)
    scale, bias = (rng.normal(size=shape[axis:]).astype(np.float32) for _ in range(2))
    axes = tuple(range(axis % len(shape), len(shape)))
    centered = x - np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(centered), axis=axes, keepdims=True)
    want = centered * np.reciprocal(np.sqrt(var + np.float32(1e-5))) * scale + bias
    (got,) = run_op(OpCode.LAYER_NORM, [x, scale, bias], axis=axis)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(4, 10, 3), (2, 6, 32, 32)], ids=["short-last-axis", "rows"])
@pytest.mark.parametrize("op", [OpCode.SOFTMAX, OpCode.LOG_SOFTMAX])
def test_softmax_is_the_numpy_formula_bit_for_bit(shape, op):
    # The peak of a short last axis is found slice by slice (the same maximum); the sum
    # is np.sum's own reduction.
    x = (np.random.default_rng(6).normal(size=shape) * 4).astype(np.float32)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    total = np.sum(np.exp(shifted), axis=-1, keepdims=True)
    want = np.exp(shifted) / total if op == OpCode.SOFTMAX else shifted - np.log(total)
    (got,) = run_op(op, [x], axis=-1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("shape", "axis"), [((1, 32), -1), ((1, 4, 8), 1), ((3, 7), 0)], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_over_one_row(shape, axis, dtype, with_bias):
    # One normalized row takes the scalar-statistics step: same values as the float64
    # formula, all three outputs.
    rng = np.random.default_rng(7)
    x = (rng.normal(size=shape) * 3 - 1).astype(dtype)
    scale = rng.normal(size=shape[axis % len(shape) :]).astype(dtype)
    bias = rng.normal(size=scale.shape).astype(dtype) if with_bias else None
    inputs = [x, scale] + ([bias] if with_bias else [])
    y, mean, inv = run_op(OpCode.LAYER_NORM, inputs, num_outputs=3, axis=axis, epsilon=1e-3)
    ry, rmean, rinv = _layer_norm64(x.astype(np.float64), scale, bias, axis, 1e-3)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, ry, rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, rmean, rtol=tol, atol=tol)
    np.testing.assert_allclose(inv, rinv, rtol=tol)
    # The mean is the dtype's own sum and division, as np.mean computes it.
    sums = np.add.reduce(x.reshape(-1), keepdims=True)
    np.testing.assert_array_equal(mean.reshape(-1), np.true_divide(sums, dtype(x.size)))


def test_layer_norm_of_a_constant_row_without_epsilon_is_nan_as_the_formula():
    x = np.full((1, 8), 2.5, np.float32)
    with np.errstate(all="ignore"):
        (y,) = run_op(OpCode.LAYER_NORM, [x, np.ones(8, np.float32)], epsilon=0.0)
        want = (x - x.mean()) * (1 / np.sqrt(np.float32(0)))  # 0 * inf
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))


def test_softmax_writes_zero_for_probabilities_below_the_smallest_normal() -> None:
    """Logits 95 below the peak give exp about 5e-42 (subnormal in float32): written as 0,
    every other probability as the float64 reference has it."""
    x = np.array([[0.0, -95.0, -3.0, -200.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    (out,) = run_op(OpCode.SOFTMAX, [x], axis=-1)
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    tiny = np.finfo(np.float32).tiny
    assert out[0, 1] == 0.0 and out[0, 3] == 0.0
    assert not np.any((out > 0) & (out < tiny))
    np.testing.assert_allclose(out, np.where(ref < tiny, 0.0, ref), rtol=1e-6, atol=0)
