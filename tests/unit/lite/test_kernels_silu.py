"""SiLU (x * sigmoid(x)) as an op and as a fused activation, against a float64 reference.

The kernel computes x / (1 + exp(-x)); the reference is the product form the converter
rewrites, evaluated in float64. Warnings are errors here: exp(-x) saturates to inf for very
negative x without NumPy's overflow warning.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite.eager import prepare_kernel, run_op
from sporenet.lite.kernels.activation import FUSED_ACTIVATIONS
from sporenet.lite.kernels.base import TensorSpec

EXTREME = [-1e4, -1e3, -120.0, -100.0, -89.0, -88.0, -20.0, -1.5, -1e-30, -0.0, 0.0]
EXTREME += [1e-30, 1.5, 20.0, 88.0, 89.0, 100.0, 120.0, 1e3, 1e4]


def _silu64(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) in float64, exp overflow to inf allowed (sigmoid -> 0)."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        return x * (1 / (1 + np.exp(-x)))


def _values(dtype: type) -> np.ndarray:
    rng = np.random.default_rng(3)
    dense = np.linspace(-30, 30, 6001)
    return np.concatenate([EXTREME, dense, rng.normal(scale=8, size=500)]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_silu_matches_float64_reference_without_warnings(dtype):
    x = _values(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (ours,) = run_op(OpCode.SILU, [x])
    assert ours.dtype == dtype and ours.shape == x.shape
    want = _silu64(x)
    # One division after exp: a few ulp of relative error. Where exp(-x) overflows to inf
    # (x below -log(max)) the result is -0.0 instead of a value under |x| / max, as the
    # product form gives once sigmoid underflows to 0: that bounds the absolute error.
    big = float(np.finfo(dtype).max)
    rtol = 2e-7 if dtype == np.float32 else 1e-15
    np.testing.assert_allclose(ours, want, rtol=rtol, atol=(np.log(big) + 1) / big)
    # Very negative inputs give -0.0, as x * sigmoid(x) does once sigmoid underflows.
    assert np.array_equal(np.signbit(ours), np.signbit(want.astype(dtype)))


def test_silu_of_infinities_and_nan_match_the_product_form():
    x = np.array([-np.inf, np.inf, np.nan, -1e4, 1e4], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (ours,) = run_op(OpCode.SILU, [x])
    with np.errstate(over="ignore", invalid="ignore"):
        product = x * (1 / (1 + np.exp(-x)))  # -inf * 0 = nan, as onnxruntime's Mul
    np.testing.assert_array_equal(ours, product)
    assert np.signbit(ours[3]) and ours[4] == 1e4


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_fused_silu_is_the_op_in_place(dtype):
    x = _values(dtype)
    (op_out,) = run_op(OpCode.SILU, [x])
    y = x.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FUSED_ACTIVATIONS["silu"](y)
    np.testing.assert_array_equal(y, op_out)


def test_conv_with_fused_silu_matches_conv_then_reference():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 3, 9, 11)).astype(np.float32)
    w = (rng.normal(size=(6, 3, 3, 3)) * 2).astype(np.float32)
    bias = rng.normal(size=6).astype(np.float32)
    (plain,) = run_op(OpCode.CONV2D, [x, w, bias], pads=[1, 1, 1, 1])
    (fused,) = run_op(OpCode.CONV2D, [x, w, bias], pads=[1, 1, 1, 1], activation="silu")
    np.testing.assert_allclose(fused, _silu64(plain), rtol=2e-7, atol=1e-30)


@pytest.mark.parametrize("layouts", ["last-last", "last-nchw", "nchw-last"])
def test_silu_on_channels_last_views(layouts):
    shape = (1, 12, 3, 5)
    n, c, h, w = shape
    value = (np.random.default_rng(7).normal(size=shape) * 20).astype(np.float32)

    def array(last: bool) -> np.ndarray:
        if last:
            return np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)
        return np.empty(shape, np.float32)

    x, out = array(layouts.startswith("last")), array(layouts.endswith("last"))
    x[...] = value
    kernel = prepare_kernel(OpCode.SILU, {}, [TensorSpec(shape, np.dtype(np.float32))], 1)
    kernel.bind([x], [out])()  # type: ignore[misc]
    np.testing.assert_allclose(out, _silu64(value), rtol=2e-7, atol=1e-30)


def test_silu_after_a_channels_last_conv_in_a_model():
    """A 1x1 Conv whose output is channels-last feeds SILU without a transposing copy."""
    rng = np.random.default_rng(9)
    b = ModelBuilder(producer="test")
    x = b.input("x", (1, 8, 4, 6))
    w = (rng.normal(size=(16, 8, 1, 1)) * 0.5).astype(np.float32)
    c = b.op(OpCode.CONV2D, [x, b.constant("w", w)])
    y = b.op(OpCode.SILU, [c])
    b.output(y, name="y")
    interp = Interpreter(model=b.build(), num_threads=1)
    xv = rng.normal(size=(1, 8, 4, 6)).astype(np.float32)
    (conv,) = run_op(OpCode.CONV2D, [xv, w])
    np.testing.assert_allclose(interp.run({"x": xv})["y"], _silu64(conv), rtol=1e-5, atol=1e-6)


def _hard_swish64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x * np.clip(x + 3, 0, 6) / 6


@pytest.mark.parametrize(("act", "reference"), [("silu", _silu64), ("hard_swish", _hard_swish64)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_fused_scratch_activation_takes_its_scratch_when_bound(act, reference, channels_last):
    """with_scratch: the activation's scratch comes with the bound step (from the plan's
    arena when planning), so a call allocates nothing out-sized; values, in either
    layout of the output, are the float64 reference's."""
    import tracemalloc

    from sporenet.lite.kernels.activation import with_scratch

    shape = (1, 16, 32, 32)
    value = (np.random.default_rng(8).normal(size=shape) * 6).astype(np.float32)
    out = (
        np.empty((1, 32, 32, 16), np.float32).transpose(0, 3, 1, 2)
        if channels_last
        else (np.empty(shape, np.float32))
    )
    bound = with_scratch(FUSED_ACTIVATIONS[act], out)
    assert bound is not None and with_scratch(bound, out) is bound  # idempotent
    out[...] = value
    tracemalloc.start()
    try:
        bound(out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < out.nbytes // 4, f"a call allocated {peak} bytes"
    # One exp and one division (SiLU) or a clip and two products (hard-swish) in float32.
    np.testing.assert_allclose(out, reference(value), rtol=1e-6, atol=1e-6)
    part = out[:, :, :5]  # a part of the output (a block of rows) gets a scratch too
    part[...] = value[:, :, :5]
    bound(part)
    np.testing.assert_allclose(part, reference(value[:, :, :5]), rtol=1e-6, atol=1e-6)


def test_silu_rejects_integer_input():
    from sporenet.lite import ShapeError

    with pytest.raises(ShapeError, match="SILU: input 0 must be a float tensor, got int32"):
        run_op(OpCode.SILU, [np.arange(3, dtype=np.int32)])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_silu_gradient_on_extreme_inputs(dtype):
    """ACTIVATION_GRAD 'silu' = g * s (1 + x (1 - s)): 0 and 1 in the saturated tails."""
    x = _values(dtype)
    g = np.random.default_rng(8).normal(size=x.shape).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (dx,) = run_op(OpCode.ACTIVATION_GRAD, [g, x, None], activation="silu")
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-x64))
    want = g * s * (1 + x64 * (1 - s))
    # 1 - s cancels for large x (s rounds to 1 in the dtype): absolute error ~ eps * x e^-x.
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(dx, want, rtol=20 * eps, atol=10 * eps)
    assert np.all(dx[x64 <= -1e3] == 0) and np.array_equal(dx[x64 >= 1e3], g[x64 >= 1e3])
