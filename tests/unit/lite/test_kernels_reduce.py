"""Reductions and ArgMax/ArgMin against NumPy and onnxruntime (opset 18: axes as input)."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode, ShapeError
from sporenet.lite.eager import run_op
from tests.unit.lite.onnx_reference import run_onnx_op

REDUCTIONS = [
    (OpCode.REDUCE_MEAN, "ReduceMean", np.mean),
    (OpCode.REDUCE_SUM, "ReduceSum", np.sum),
    (OpCode.REDUCE_MAX, "ReduceMax", np.max),
    (OpCode.REDUCE_MIN, "ReduceMin", np.min),
    (OpCode.REDUCE_PROD, "ReduceProd", np.prod),
]
AXES = [None, [0], [-1], [1, 2], [0, -1], [2, 0, 1]]


@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("axes", AXES, ids=str)
@pytest.mark.parametrize(("op", "onnx_op", "ref"), REDUCTIONS, ids=[r[0].name for r in REDUCTIONS])
def test_reductions(op, onnx_op, ref, axes, keepdims):
    x = np.random.default_rng(int(op)).uniform(0.5, 1.5, size=(2, 3, 4)).astype(np.float32)
    expected = ref(
        x.astype(np.float64), axis=None if axes is None else tuple(axes), keepdims=bool(keepdims)
    )
    axes_in = None if axes is None else np.array(axes, np.int64)
    (from_input,) = run_op(op, [x, axes_in], keepdims=keepdims)
    attrs = {} if axes is None else {"axes": axes}
    (from_attr,) = run_op(op, [x], keepdims=keepdims, **attrs)
    assert from_input.shape == np.shape(expected) and from_input.dtype == np.float32
    # float32 accumulation of up to 24 values vs a float64 reference.
    np.testing.assert_allclose(from_input, expected, rtol=2e-6)
    np.testing.assert_array_equal(from_attr, from_input)
    (theirs,) = run_onnx_op(onnx_op, [x, axes_in], initializers=[1], opset=18, keepdims=keepdims)
    np.testing.assert_allclose(from_input, theirs, rtol=2e-6)


@pytest.mark.parametrize(("op", "onnx_op", "ref"), REDUCTIONS, ids=[r[0].name for r in REDUCTIONS])
def test_noop_with_empty_axes_is_identity(op, onnx_op, ref):
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    (ours,) = run_op(op, [x, np.array([], np.int64)], noop_with_empty_axes=1)
    np.testing.assert_array_equal(ours, x)
    (all_axes,) = run_op(op, [x, np.array([], np.int64)], keepdims=0)
    np.testing.assert_allclose(all_axes, ref(x), rtol=1e-6)
    (theirs,) = run_onnx_op(
        onnx_op, [x, np.array([], np.int64)], initializers=[1], opset=18, noop_with_empty_axes=1
    )
    np.testing.assert_array_equal(ours, theirs)


def test_integer_sum_max_prod():
    x = np.arange(1, 13, dtype=np.int64).reshape(3, 4)
    assert run_op(OpCode.REDUCE_SUM, [x], axes=[1], keepdims=0)[0].tolist() == [10, 26, 42]
    assert run_op(OpCode.REDUCE_MAX, [x], axes=[0])[0].tolist() == [[9, 10, 11, 12]]
    assert run_op(OpCode.REDUCE_PROD, [x[:, :2]], axes=[1], keepdims=0)[0].tolist() == [2, 30, 90]


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [(np.float32, -np.inf, np.inf), (np.int16, -32768, 32767), (np.bool_, False, True)],
)
def test_max_min_of_an_empty_set_is_the_dtypes_extreme(dtype, low, high):
    empty = np.zeros((2, 0, 3), dtype)
    (top,) = run_op(OpCode.REDUCE_MAX, [empty], axes=[1], keepdims=0)
    (bottom,) = run_op(OpCode.REDUCE_MIN, [empty], axes=[1], keepdims=0)
    assert top.dtype == dtype and top.tolist() == [[low] * 3] * 2
    assert bottom.tolist() == [[high] * 3] * 2


def test_max_min_of_bools_are_any_and_all():
    x = np.array([[True, False], [False, False]])
    assert run_op(OpCode.REDUCE_MAX, [x], axes=[1], keepdims=0)[0].tolist() == [True, False]
    assert run_op(OpCode.REDUCE_MIN, [x], axes=[0], keepdims=0)[0].tolist() == [False, False]


def test_reduce_errors():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeError, match="axes entry 2 is out of range for rank 2"):
        run_op(OpCode.REDUCE_SUM, [x], axes=[2])
    with pytest.raises(ShapeError, match=r"axes \[1, -1\] name the same axis twice"):
        run_op(OpCode.REDUCE_MEAN, [x], axes=[1, -1])
    with pytest.raises(ShapeError, match="REDUCE_MEAN: input 0 must be a float tensor"):
        run_op(OpCode.REDUCE_MEAN, [np.zeros(3, np.int32)])
    with pytest.raises(ShapeError, match=r"input 1 \(axes\) must be a constant"):
        run_op(OpCode.REDUCE_SUM, [x, np.array([0], np.int64)], constant_inputs=[0])
    with pytest.raises(ShapeError, match="input must be a number tensor, got bool"):
        run_op(OpCode.REDUCE_SUM, [x > 0])


# --------------------------------------------------------------------------- ArgMax, ArgMin


@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize(("op", "onnx_op"), [(OpCode.ARGMAX, "ArgMax"), (OpCode.ARGMIN, "ArgMin")])
def test_arg_reductions_with_ties(op, onnx_op, axis, keepdims, last):
    # Few distinct values so ties are common and select_last_index matters.
    x = np.random.default_rng(3).integers(0, 3, size=(3, 4, 5)).astype(np.float32)
    (ours,) = run_op(op, [x], axis=axis, keepdims=keepdims, select_last_index=last)
    find = np.argmax if op == OpCode.ARGMAX else np.argmin
    if last:
        flipped = np.flip(x, axis=axis)
        expected = x.shape[axis] - 1 - find(flipped, axis=axis, keepdims=bool(keepdims))
    else:
        expected = find(x, axis=axis, keepdims=bool(keepdims))
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, expected)
    (theirs,) = run_onnx_op(onnx_op, [x], axis=axis, keepdims=keepdims, select_last_index=last)
    np.testing.assert_array_equal(ours, theirs)


def test_argmax_default_axis_and_int_input():
    x = np.array([[1, 5], [7, 2]], np.int32)
    (ours,) = run_op(OpCode.ARGMAX, [x])
    assert ours.tolist() == [[1, 0]]


def test_arg_errors():
    with pytest.raises(ShapeError, match=r"axis 1 of shape \[3, 0\] is empty"):
        run_op(OpCode.ARGMAX, [np.zeros((3, 0), np.float32)], axis=1)
    with pytest.raises(ShapeError, match="axis -3 is out of range for rank 2"):
        run_op(OpCode.ARGMIN, [np.zeros((3, 2), np.float32)], axis=-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("shape", "axes", "keepdims"),
    [((2, 3, 4, 5), [1], 1), ((1, 32), [1], 1), ((2, 3, 40, 50), [2, 3], 0), ((3, 4), [0, 1], 0)],
)
def test_reduce_mean_is_numpy_mean_bit_for_bit(shape, axes, keepdims, dtype):
    # The bound step skips np.mean's wrapper; the sum and the division are np.mean's own.
    x = (np.random.default_rng(1).normal(size=shape) * 100).astype(dtype)
    (ours,) = run_op(OpCode.REDUCE_MEAN, [x], axes=axes, keepdims=keepdims)
    want = np.mean(x, axis=tuple(axes), keepdims=bool(keepdims))
    assert ours.dtype == want.dtype
    np.testing.assert_array_equal(ours, want)


@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_])
@pytest.mark.parametrize(("op", "ref"), [(OpCode.REDUCE_MAX, np.max), (OpCode.REDUCE_MIN, np.min)])
def test_max_min_over_a_short_last_axis_slice_by_slice(op, ref, dtype, keepdims):
    # Many rows of 3 values: reduced slice by slice, the same values as NumPy, NaN included.
    x = np.random.default_rng(2).normal(size=(4, 10, 3)) * 50
    if dtype is np.float32:
        x[1, 2, 1] = np.nan
    x = (x > 0) if dtype is np.bool_ else x.astype(dtype)
    (ours,) = run_op(op, [x], axes=[-1], keepdims=keepdims)
    np.testing.assert_array_equal(ours, ref(x, axis=-1, keepdims=bool(keepdims)))
