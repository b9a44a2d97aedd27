"""Binary elementwise kernels with NumPy broadcasting, against NumPy and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode, ShapeError
from sporenet.lite.eager import prepare_kernel, run_op
from sporenet.lite.kernels.base import TensorSpec
from tests.unit.lite.onnx_reference import run_onnx_op

BINARY = [
    (OpCode.ADD, "Add", np.add),
    (OpCode.SUB, "Sub", np.subtract),
    (OpCode.MUL, "Mul", np.multiply),
    (OpCode.DIV, "Div", np.divide),
    (OpCode.MAXIMUM, "Max", np.maximum),
    (OpCode.MINIMUM, "Min", np.minimum),
    (OpCode.POW, "Pow", np.power),
    (OpCode.EQUAL, "Equal", np.equal),
    (OpCode.GREATER, "Greater", np.greater),
    (OpCode.LESS, "Less", np.less),
]
BROADCAST = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 3, 4), (3, 1)),
    ((3, 1), (1, 5)),
    ((), (2, 3)),
    ((2, 1, 4, 1), (3, 1, 5)),
    ((1,), ()),
]


@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCAST, ids=str)
@pytest.mark.parametrize(("op", "onnx_op", "ref"), BINARY, ids=[b[0].name for b in BINARY])
def test_binary_float32_broadcasting(op, onnx_op, ref, a_shape, b_shape):
    rng = np.random.default_rng(int(op))
    a = rng.uniform(0.5, 3, size=a_shape).astype(np.float32)
    b = rng.uniform(0.5, 3, size=b_shape).astype(np.float32)
    if op in (OpCode.EQUAL, OpCode.GREATER, OpCode.LESS):
        b = np.round(b).astype(np.float32)  # some exact ties so Equal is not always False
        a = np.round(a).astype(np.float32)
    (ours,) = run_op(op, [a, b])
    expected = ref(a, b)
    assert ours.shape == np.broadcast_shapes(a_shape, b_shape)
    assert ours.dtype == expected.dtype
    # Same float32 ufuncs as the reference: Pow may differ by an ulp through libm.
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    (theirs,) = run_onnx_op(onnx_op, [a, b], opset=13)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_binary_with_runtime_inputs_and_fused_relu():
    a = np.array([[-2.0, 1.0], [3.0, -4.0]], np.float32)
    b = np.array([1.0, -3.0], np.float32)
    (ours,) = run_op(OpCode.ADD, [a, b], constant_inputs=[], activation="relu")
    np.testing.assert_array_equal(ours, np.maximum(a + b, 0))
    (ours,) = run_op(OpCode.MUL, [a, b], activation="relu6")
    np.testing.assert_array_equal(ours, np.clip(a * b, 0, 6))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_division_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, 0, np.iinfo(dtype).max], dtype)
    b = np.array([2, 2, -2, -2, 3, 5, 1], dtype)
    (ours,) = run_op(OpCode.DIV, [a, b])
    assert ours.dtype == dtype
    np.testing.assert_array_equal(ours, [3, -3, -3, 3, 2, 0, np.iinfo(dtype).max])
    (theirs,) = run_onnx_op("Div", [a, b])
    np.testing.assert_array_equal(ours, theirs)


def test_integer_arithmetic():
    a = np.arange(-4, 4, dtype=np.int64).reshape(2, 4)
    b = np.array([3, -2, 5, 1], np.int64)
    for op, ref in (
        (OpCode.ADD, np.add),
        (OpCode.SUB, np.subtract),
        (OpCode.MUL, np.multiply),
        (OpCode.MAXIMUM, np.maximum),
        (OpCode.MINIMUM, np.minimum),
    ):
        (ours,) = run_op(op, [a, b])
        np.testing.assert_array_equal(ours, ref(a, b))


def test_pow_with_integer_exponent_keeps_base_dtype():
    a = np.array([[1.5, -2.0, 3.0]], np.float32)
    e = np.array([2, 3, 0], np.int64)
    (ours,) = run_op(OpCode.POW, [a, e])
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, [[2.25, -8.0, 1.0]])
    (theirs,) = run_onnx_op("Pow", [a, e], opset=15)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("exponent", [np.float32(2), np.float32(3), np.int64(3)])
def test_pow_by_constant_two_or_three_is_the_products(dtype, exponent):
    # onnxruntime squares as x * x and cubes as x * x * x (not powf): exact IEEE products.
    a = (np.random.default_rng(3).standard_normal((4, 33)) * 4).astype(dtype)
    a[0, :4] = [0.0, -0.0, np.inf, -np.inf]
    (ours,) = run_op(OpCode.POW, [a, np.array(exponent)])
    want = a * a if exponent == 2 else a * a * a
    np.testing.assert_array_equal(ours, want)
    (theirs,) = run_onnx_op("Pow", [a, np.array(exponent)], opset=15)
    np.testing.assert_array_equal(ours, theirs)


def test_binary_errors_name_the_problem():
    with pytest.raises(ShapeError, match=r"ADD: shapes \[2, 3\] and \[4\] do not broadcast"):
        run_op(OpCode.ADD, [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)])
    with pytest.raises(ShapeError, match="SUB: inputs must share a dtype, got float32 and int32"):
        run_op(OpCode.SUB, [np.zeros(2, np.float32), np.zeros(2, np.int32)])
    with pytest.raises(ShapeError, match="unknown fused activation 'swish'"):
        run_op(OpCode.ADD, [np.zeros(2, np.float32)] * 2, activation="swish")
    with pytest.raises(ShapeError, match="a fused activation needs a float output, got bool"):
        run_op(OpCode.LESS, [np.zeros(2, np.float32)] * 2, activation="relu")
    with pytest.raises(ShapeError, match=r"takes 2\.\.2 inputs, got 1"):
        run_op(OpCode.MUL, [np.zeros(2, np.float32)])


@pytest.mark.parametrize("one_first", [False, True])
def test_a_one_element_operand_is_read_live_at_every_call(one_first):
    # A one-element operand runs as a 0-d view of its array: each call sees its value.
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    one = np.array([[2.0]], np.float32)
    inputs = [one, x] if one_first else [x, one]
    specs = [TensorSpec(a.shape, a.dtype) for a in inputs]
    out = np.empty((2, 3), np.float32)
    step = prepare_kernel(OpCode.SUB, {}, specs, 1).bind(inputs, [out])
    for value in (2.0, -3.5):
        one[0, 0] = value
        step()
        want = value - x if one_first else x - value
        np.testing.assert_array_equal(out, want)


def test_an_operand_broadcast_over_ones_is_read_live_as_the_outputs_shape():
    # A bias (C,) added to a (1, C) row is passed as a (1, C) view: a view, so a value
    # written after the step is bound is the one added; the same elements either way.
    from sporenet.lite.kernels.elementwise import _plain, same_shape

    a = np.arange(8, dtype=np.float32).reshape(1, 8)
    b, out = np.ones(8, np.float32), np.empty((1, 8), np.float32)
    assert same_shape(b, out).base is b
    assert same_shape(np.ones((2, 4), np.float32), out).shape == (2, 4)  # other elements
    step = _plain(np.add, a, b, out)
    b[:] = np.linspace(-1, 1, 8, dtype=np.float32)
    step()
    np.testing.assert_array_equal(out, a + b)
