"""Unary kernels and activations against NumPy (float64) references and onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sporenet.lite import OpCode, ShapeError
from sporenet.lite.eager import prepare_kernel, run_op
from sporenet.lite.kernels import unary
from sporenet.lite.kernels.activation import relu_into
from sporenet.lite.kernels.base import TensorSpec
from tests.unit.lite.onnx_reference import run_onnx_op

SHAPES = [(), (7,), (2, 3, 4, 5)]


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf64(x / math.sqrt(2)))


def _gelu_tanh64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# op, onnx op (or None), float64 reference, attrs, input range (lo, hi)
CASES = [
    (OpCode.RELU, "Relu", lambda x: np.maximum(x, 0), {}, (-5, 5)),
    (OpCode.RELU6, None, lambda x: np.clip(x, 0, 6), {}, (-8, 8)),
    (OpCode.SIGMOID, "Sigmoid", lambda x: 1 / (1 + np.exp(-x)), {}, (-20, 20)),
    (OpCode.TANH, "Tanh", np.tanh, {}, (-5, 5)),
    (
        OpCode.LEAKY_RELU,
        "LeakyRelu",
        lambda x: np.where(x < 0, 0.1 * x, x),
        {"alpha": 0.1},
        (-5, 5),
    ),
    (OpCode.LEAKY_RELU, "LeakyRelu", lambda x: np.where(x < 0, 0.01 * x, x), {}, (-5, 5)),
    (
        OpCode.LEAKY_RELU,
        "LeakyRelu",
        lambda x: np.where(x < 0, 3.0 * x, x),
        {"alpha": 3.0},
        (-5, 5),
    ),
    (OpCode.HARD_SIGMOID, "HardSigmoid", lambda x: np.clip(0.2 * x + 0.5, 0, 1), {}, (-5, 5)),
    (
        OpCode.HARD_SIGMOID,
        "HardSigmoid",
        lambda x: np.clip(0.3 * x + 0.4, 0, 1),
        {"alpha": 0.3, "beta": 0.4},
        (-5, 5),
    ),
    (OpCode.HARD_SWISH, "HardSwish", lambda x: x * np.clip(x / 6 + 0.5, 0, 1), {}, (-5, 5)),
    (OpCode.GELU, "Gelu", _gelu64, {}, (-6, 6)),
    (OpCode.GELU, "Gelu", _gelu_tanh64, {"approximate": "tanh"}, (-6, 6)),
    (OpCode.ELU, "Elu", lambda x: np.where(x > 0, x, np.expm1(x)), {}, (-5, 5)),
    (OpCode.ELU, "Elu", lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)), {"alpha": 0.5}, (-5, 5)),
    (OpCode.SOFTPLUS, "Softplus", lambda x: np.logaddexp(0, x), {}, (-30, 30)),
    (OpCode.EXP, "Exp", np.exp, {}, (-10, 10)),
    (OpCode.LOG, "Log", np.log, {}, (0.01, 100)),
    (OpCode.SQRT, "Sqrt", np.sqrt, {}, (0, 100)),
    (OpCode.RSQRT, None, lambda x: 1 / np.sqrt(x), {}, (0.01, 100)),
    (OpCode.NEG, "Neg", np.negative, {}, (-5, 5)),
    (OpCode.ABS, "Abs", np.abs, {}, (-5, 5)),
    (OpCode.RECIPROCAL, "Reciprocal", lambda x: 1 / x, {}, (0.1, 10)),
    (OpCode.ERF, "Erf", _erf64, {}, (-4, 4)),
    (OpCode.FLOOR, "Floor", np.floor, {}, (-5, 5)),
    (OpCode.CEIL, "Ceil", np.ceil, {}, (-5, 5)),
    (OpCode.SQUARE, None, np.square, {}, (-5, 5)),
]
IDS = [f"{c[0].name}-{'-'.join(f'{k}={v}' for k, v in c[3].items())}" for c in CASES]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(("op", "onnx_op", "ref", "attrs", "bounds"), CASES, ids=IDS)
def test_unary_matches_numpy_and_onnxruntime(op, onnx_op, ref, attrs, bounds, shape):
    rng = np.random.default_rng(int(op))
    x = rng.uniform(*bounds, size=shape).astype(np.float32)
    (ours,) = run_op(op, [x], **attrs)
    assert ours.shape == x.shape and ours.dtype == np.float32
    # float32 results vs a float64 reference: a few ulp of relative error, plus an absolute
    # floor for results near zero (Gelu and Erf go through the 1.5e-7 erf approximation).
    np.testing.assert_allclose(ours, ref(x.astype(np.float64)), rtol=2e-6, atol=1e-6)
    if onnx_op is not None:
        (theirs,) = run_onnx_op(onnx_op, [x], opset=20, **attrs)
        np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=1e-6)


def test_erf_error_below_1e6_on_a_dense_grid():
    x = np.linspace(-6, 6, 200_001, dtype=np.float32)
    (ours,) = run_op(OpCode.ERF, [x])
    err = np.abs(ours.astype(np.float64) - _erf64(x.astype(np.float64)))
    assert err.max() < 1e-6
    assert ours[0] == -1 and ours[-1] == 1
    np.testing.assert_array_equal(ours, -ours[::-1])  # exactly odd


def test_gelu_tails_and_softplus_do_not_overflow():
    x = np.array([-1e4, -50, 50, 1e4], np.float32)
    with np.errstate(over="raise", invalid="raise"):  # underflow to 0 is expected
        (gelu,) = run_op(OpCode.GELU, [x])
        (soft,) = run_op(OpCode.SOFTPLUS, [x])
    np.testing.assert_allclose(gelu, [0, 0, 50, 1e4], atol=1e-6)
    np.testing.assert_allclose(soft, [0, 0, 50, 1e4], atol=1e-6)


def test_gelu_at_infinities_and_nan_computes_what_the_erf_form_does():
    # x * 0.5 * (1 + erf(x / sqrt 2)) in IEEE arithmetic: inf, then -inf * 0 = nan.
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    with np.errstate(invalid="ignore"):
        (gelu,) = run_op(OpCode.GELU, [x])
    assert gelu[0] == np.inf
    assert np.isnan(gelu[1:3]).all()
    assert gelu[3] == 0 and gelu[4] == 0


def test_float64_inputs_keep_their_dtype():
    x = np.linspace(-3, 3, 11)
    (ours,) = run_op(OpCode.HARD_SWISH, [x])
    assert ours.dtype == np.float64
    np.testing.assert_allclose(ours, x * np.clip(x / 6 + 0.5, 0, 1), rtol=1e-12)


def test_neg_abs_square_accept_integers():
    x = np.array([-3, 0, 2], np.int32)
    assert run_op(OpCode.NEG, [x])[0].tolist() == [3, 0, -2]
    assert run_op(OpCode.ABS, [x])[0].tolist() == [3, 0, 2]
    assert run_op(OpCode.SQUARE, [x])[0].tolist() == [9, 0, 4]


@pytest.mark.parametrize("op", [OpCode.RELU, OpCode.GELU, OpCode.EXP, OpCode.ERF, OpCode.LOG])
def test_float_ops_reject_integer_inputs(op):
    with pytest.raises(ShapeError, match=rf"{op.name}: input 0 must be a float tensor, got int32"):
        run_op(op, [np.arange(3, dtype=np.int32)])


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ShapeError, match="'approximate' must be 'none' or 'tanh', got 'fast'"):
        run_op(OpCode.GELU, [np.zeros(3, np.float32)], approximate="fast")


# --------------------------------------------------------------------------- Clip


def _clipped(x, lo, hi):
    # Clip's reference: np.maximum then np.minimum, each bound only where given.
    expected = x.copy()
    if lo is not None:
        expected = np.maximum(expected, lo)
    if hi is not None:
        expected = np.minimum(expected, hi)
    return expected


CLIP_BOUNDS = [(-1.0, 2.0), (None, 2.0), (-1.0, None), (None, None), (3.0, 1.0)]


@pytest.mark.parametrize(("lo", "hi"), CLIP_BOUNDS, ids=str)
def test_clip_bounds_as_attributes(lo, hi):
    x = np.random.default_rng(0).uniform(-4, 4, size=(3, 5)).astype(np.float32)
    attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    (ours,) = run_op(OpCode.CLIP, [x], **attrs)
    expected = _clipped(x, lo, hi)
    np.testing.assert_array_equal(ours, expected)
    inputs = [x, None if lo is None else np.float32(lo), None if hi is None else np.float32(hi)]
    (theirs,) = run_onnx_op("Clip", inputs, opset=13)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize(("lo", "hi"), CLIP_BOUNDS, ids=str)
def test_clip_keeps_nan_and_clips_infinities(lo, hi):
    # NaN propagates and a missing bound leaves infinities as they are, as np.maximum and
    # np.minimum do (onnxruntime clips them to float32's largest value, so the test
    # above compares finite inputs only).
    x = np.array([np.nan, np.inf, -np.inf, -0.5, 5.0], np.float32)
    attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    (ours,) = run_op(OpCode.CLIP, [x], **attrs)
    expected = _clipped(x, lo, hi)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("constant", [True, False], ids=["constant", "runtime"])
@pytest.mark.parametrize(("lo", "hi"), CLIP_BOUNDS, ids=str)
def test_clip_bounds_as_inputs(lo, hi, constant):
    x = np.random.default_rng(1).uniform(-4, 4, size=(2, 3, 4)).astype(np.float32)
    inputs = [x, None if lo is None else np.float32(lo), None if hi is None else np.float32(hi)]
    consts = None if constant else [0]
    (ours,) = run_op(OpCode.CLIP, inputs, constant_inputs=consts)
    (theirs,) = run_onnx_op("Clip", inputs, opset=13)
    np.testing.assert_array_equal(ours, theirs)


def test_clip_integer_tensor():
    x = np.arange(-5, 5, dtype=np.int64)
    (ours,) = run_op(OpCode.CLIP, [x, np.int64(-2), np.int64(3)])
    np.testing.assert_array_equal(ours, np.clip(x, -2, 3))
    (ours,) = run_op(OpCode.CLIP, [x], min=-2.0, max=3)
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, np.clip(x, -2, 3))
    with pytest.raises(
        ShapeError,
        match=r"attribute 'min' = -1\.5 is not a whole number for "
        "the int64 input",
    ):
        run_op(OpCode.CLIP, [x], min=-1.5)


def test_clip_rejects_non_scalar_bound_and_dtype_mismatch():
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(ShapeError, match=r"input 1 \(min\) must hold one value, got shape \[2\]"):
        run_op(OpCode.CLIP, [x, np.zeros(2, np.float32)])
    with pytest.raises(ShapeError, match=r"input 2 \(max\) must be float32 like x, got float64"):
        run_op(OpCode.CLIP, [x, None, np.float64(1)])


# --------------------------------------------------------------------------- PRelu

PRELU_SLOPES = [(), (1,), (5,), (3, 1, 1), (2, 3, 4, 5), (4, 1)]


def _assert_prelu_close(ours: np.ndarray, x: np.ndarray, slope: np.ndarray) -> None:
    """Constant slopes on both sides of 1 run x + min(x, 0)*(slope - 1): two roundings
    (three when slope - 1 rounds), so within a few ulps of |x| of the float64 value;
    NaN where x is NaN."""
    x64 = x.astype(np.float64)
    exact = np.where(x64 >= 0, x64, x64 * slope)
    bound = 4 * np.finfo(np.float32).eps * np.abs(x64) * np.maximum(1, np.abs(slope))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(x))
    finite = ~np.isnan(x)
    assert np.all(np.abs(ours - exact)[finite] <= bound[finite])


@pytest.mark.parametrize("slope_shape", PRELU_SLOPES, ids=str)
def test_prelu_broadcasts_slope(slope_shape):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    slope = rng.uniform(-0.5, 2, size=slope_shape).astype(np.float32)
    (ours,) = run_op(OpCode.PRELU, [x, slope])
    _assert_prelu_close(ours, x, slope)
    (theirs,) = run_onnx_op("PRelu", [x, slope], initializers=[1])
    _assert_prelu_close(theirs, x, slope)  # onnxruntime: the same bound


@pytest.mark.parametrize(("low", "high"), [(-0.5, 1.0), (1.0, 3.0), (-0.5, 2.0)])
@pytest.mark.parametrize("constant", [True, False], ids=["const", "runtime"])
def test_prelu_matches_the_definition(low, high, constant):
    # Constant slopes all <= 1 (or all >= 1) take a two-pass path and run-time slopes
    # four passes: the same values as the definition (a zero's sign aside), NaN
    # included. Constant slopes on both sides of 1 take three passes, within a few ulps.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    x[0, 0, 0, :3] = [0.0, -0.0, np.nan]
    slope = rng.uniform(low, high, size=(3, 1, 1)).astype(np.float32)
    slope[0] = low
    (ours,) = run_op(OpCode.PRELU, [x, slope], constant_inputs=None if constant else [])
    if constant and low < 1 < high:
        _assert_prelu_close(ours, x, slope)
    else:
        np.testing.assert_array_equal(ours, np.where(x >= 0, x, x * slope))


def _stored(shape: tuple[int, ...], channels_last: bool) -> np.ndarray:
    """An uninitialised (N, C, H, W) array, its memory NCHW or channels-last."""
    if not channels_last:
        return np.empty(shape, np.float32)
    n, c, h, w = shape
    return np.empty((n, h, w, c), np.float32).transpose(0, 3, 1, 2)


@pytest.mark.parametrize(("x_last", "out_last"), [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize(("low", "high"), [(-0.5, 1.0), (-0.5, 2.0)])
def test_prelu_on_channels_last_storage_matches_the_definition(x_last, out_last, low, high):
    # The planner may store x, out or both channels-last; the passes then run on rows of
    # W*C elements, after one transposing copy when the two layouts differ.
    rng = np.random.default_rng(4)
    shape = (2, 6, 5, 7)
    x = _stored(shape, x_last)
    x[...] = rng.normal(size=shape)
    slope = rng.uniform(low, high, size=(6, 1, 1)).astype(np.float32)
    specs = [TensorSpec(shape, x.dtype), TensorSpec(slope.shape, slope.dtype, value=slope)]
    kernel = prepare_kernel(OpCode.PRELU, {}, specs, 1)
    out = _stored(shape, out_last)
    kernel.bind([x, slope], [out])()
    if high > 1:
        _assert_prelu_close(out, x, slope)
    else:
        np.testing.assert_array_equal(out, np.where(x >= 0, x, x * slope))


def test_prelu_slope_as_runtime_input():
    x = np.array([[-2.0, 3.0], [4.0, -1.0]], np.float32)
    slope = np.array([0.5, 2.0], np.float32)
    (ours,) = run_op(OpCode.PRELU, [x, slope], constant_inputs=[])
    np.testing.assert_array_equal(ours, [[-1.0, 3.0], [4.0, -2.0]])


def test_prelu_rejects_slope_that_does_not_broadcast_to_x():
    x = np.zeros((1, 3, 4, 5), np.float32)
    with pytest.raises(
        ShapeError,
        match=r"slope of shape \[3\] does not broadcast to x of shape "
        r"\[1, 3, 4, 5\] \(for per-channel NCHW slopes use "
        r"shape \[3, 1, 1\]\)",
    ):
        run_op(OpCode.PRELU, [x, np.zeros(3, np.float32)])
    with pytest.raises(ShapeError, match="does not broadcast"):
        # Bidirectional broadcasting would give [2, 3]; PRelu's output must keep x's shape.
        run_op(OpCode.PRELU, [np.zeros((1, 3), np.float32), np.zeros((2, 1), np.float32)])


def test_prelu_on_channels_last_storage():
    # An NCHW view of NHWC memory in and out (as the planner stores it between depthwise
    # layers): the mixed-slope scratch takes the same layout; the values are the same.
    from sporenet.lite.kernels.base import Attrs, TensorSpec
    from sporenet.lite.kernels.unary import PRelu

    rng = np.random.default_rng(4)
    x = np.ascontiguousarray(rng.normal(size=(1, 6, 5, 8)).astype(np.float32))
    x_last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    slope = rng.uniform(-1, 2, size=(6, 1, 1)).astype(np.float32)
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(slope.shape, slope.dtype, slope)]
    kernel = PRelu(Attrs("PRELU", {}, 1), specs)
    out = np.empty((1, 5, 8, 6), np.float32).transpose(0, 3, 1, 2)
    kernel.bind([x_last, slope], [out])()
    _assert_prelu_close(out, x, slope)


@pytest.mark.parametrize("x_last", [False, True], ids=["nchw-in", "channels-last-in"])
def test_large_channels_last_prelu_in_blocks_matches_a_small_one(x_last):
    # A channels-last PReLU of several blocks (unary._PRELU_BLOCK) runs block by block;
    # each element's value is the one the same rows get as a small tensor.
    rng = np.random.default_rng(5)
    shape = (1, 32, 96, 60)  # rows of 7.5 KiB: blocks of 34 rows, the last one shorter
    x = _stored(shape, x_last)
    x[...] = rng.normal(size=shape)
    assert x.nbytes > 2 * unary._PRELU_BLOCK
    slope = rng.uniform(-0.5, 2, size=(32, 1, 1)).astype(np.float32)
    specs = [TensorSpec(shape, x.dtype), TensorSpec(slope.shape, slope.dtype, value=slope)]
    out = _stored(shape, True)
    prepare_kernel(OpCode.PRELU, {}, specs, 1).bind([x, slope], [out])()
    _assert_prelu_close(out, x, slope)
    row = _stored((1, 32, 1, 60), True)
    small = [TensorSpec(row.shape, row.dtype), specs[1]]
    for h in range(shape[2]):
        row[...] = x[:, :, h : h + 1]
        got = _stored(row.shape, True)
        prepare_kernel(OpCode.PRELU, {}, small, 1).bind([row, slope], [got])()
        np.testing.assert_array_equal(out[:, :, h : h + 1], got)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_multi_pass_kernels_in_blocks_match_the_whole_array(channels_last):
    # A tensor of several blocks (unary.BLOCK) is computed block by block in memory
    # order, also when it is an NCHW view of channels-last memory; each element's value
    # is the one a small tensor gets.
    x = np.random.default_rng(4).normal(size=(2, 5, 90, 100)).astype(np.float32)
    assert x.size > 2 * unary.BLOCK
    for op in (OpCode.ERF, OpCode.GELU, OpCode.SOFTPLUS):
        kernel = prepare_kernel(op, {}, [TensorSpec(x.shape, x.dtype)], 1)
        src = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        src = src if channels_last else x
        out = np.empty_like(src)  # the same layout as src
        kernel.bind([src], [out])()
        rows = [run_op(op, [row])[0] for row in x.reshape(-1, 100)]  # 100 values: one block
        np.testing.assert_array_equal(out, np.concatenate(rows).reshape(x.shape))


@pytest.mark.parametrize(
    ("size", "dtype"), [(16, np.float32), (4096, np.float32), (16, np.int32)], ids=str
)
def test_a_bound_fused_relu_equals_the_formula(size, dtype):
    # The route is chosen when bound (small float: one maximum call); every route gives
    # max(x, 0), NaN kept. The bound step reads the array's value at each call.
    from sporenet.lite.kernels.activation import FUSED_ACTIVATIONS, bound_activation
    from sporenet.lite.opset.decl import Activation

    out = np.zeros(size, dtype)
    step = bound_activation(FUSED_ACTIVATIONS[Activation.RELU], out)
    x = (np.random.default_rng(3).normal(size=size) * 5).astype(dtype)
    if dtype == np.float32:
        x[0] = np.nan
    out[:] = x
    step()
    np.testing.assert_array_equal(out, np.maximum(x, 0))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
@pytest.mark.parametrize("size", [7, 5000])  # both routes: small tensors and large ones
def test_fused_relu_of_an_integer_tensor_keeps_its_dtype(dtype, size):
    # RELU the op takes floats only; the fused form (relu_into) also serves integer steps.
    x = np.arange(size, dtype=np.int64).astype(dtype) - dtype(3)
    out = np.empty_like(x)
    relu_into(x, out)
    np.testing.assert_array_equal(out, np.maximum(x, 0))
