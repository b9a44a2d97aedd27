"""The folded requantization (OutputStage) equals TFLite's two-step arithmetic (the int64
reference) on both of its routes, for multipliers below and above 1, exact powers of two,
negative ties, zero points and clamps; one-value stages and 8-bit lookups equal their
array forms."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sporenet.lite.kernels.quantized.base import byte_lookup
from sporenet.lite.kernels.quantized.output_stage import OutputStage
from tests.unit.lite.quantized_reference import requantize


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e-6, 2.0**-20, 3.1e-4, 0.25, 0.5, 0.7, 1.0, 1.5, 4.0, 2.0**-9]),
    st.integers(-128, 127),
    st.sampled_from([(-128, 127), (0, 127), (-3, 60)]),
    st.sampled_from([100, 2**20, 2**26]),
)
def test_output_stage_equals_the_two_step_reference(seed, real, zo, clamp, bound):
    rng = np.random.default_rng(seed)
    channels = 4
    reals = real * rng.choice([1.0, 0.5, 2.0, 1.37], channels)
    bias = rng.integers(-1000, 1000, channels)
    acc = rng.integers(-bound, bound + 1, (3, channels)).astype(np.float64)
    # Ties of both roundings: values whose products land on halves.
    acc[0, :] = -1
    acc[1, :] = -(2 ** rng.integers(0, 12, channels)) - bias
    lo, hi = max(clamp[0], -128), clamp[1]
    stage = OutputStage(reals, bias, zo, lo, hi, bound, (channels,))
    out = np.empty(acc.shape, np.int8)
    wide = np.empty(acc.shape, stage.wide_dtype)
    stage.bind(acc, out, wide)()
    want = requantize(acc.astype(np.int64) + bias, reals, zo, lo, hi, channel_axis=1)
    np.testing.assert_array_equal(out, want)


def test_both_routes_are_taken():
    reals = np.array([0.001])
    small = OutputStage(reals, None, 0, -128, 127, 1000, (1,))
    large = OutputStage(reals, None, 0, -128, 127, 2**30, (1,))
    assert small.float_path and not large.float_path


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e-6, 3.1e-4, 0.25, 0.7, 1.0, 1.5, 2.0**-9]),
    st.integers(-128, 127),
    st.sampled_from([(-128, 127), (0, 127), (-3, 60)]),
)
def test_folded_stage_equals_the_two_step_reference(seed, real, zo, clamp):
    # Folded: the multiply and offset inside a float64 GEMM against a row of ones.
    rng = np.random.default_rng(seed)
    channels, k, p = 5, 12, 4
    reals = real * rng.choice([1.0, 0.5, 2.0, 1.37], channels)
    bias = rng.integers(-1000, 1000, channels)
    w = rng.integers(-127, 128, (channels, k)).astype(np.int8)
    cols = rng.integers(-255, 256, (k, p))
    cols[:, 0] = 0  # acc = 0: the -1/0 tie thresholds
    lo, hi = clamp
    bound = 255 * int(np.abs(w.astype(np.int64)).sum(axis=1).max())
    stage = OutputStage(reals, bias, zo, lo, hi, bound, (channels, 1))
    fold = stage.folded(w)
    # Tiny multipliers put the clamp's shift beyond 2^53 units: no fold, the route declines.
    assert (fold is not None) or real < 1e-5
    assume(fold is not None)
    v = np.empty((channels, p), np.float64)
    out = np.empty((1, channels, p), np.int8)
    mask = np.empty(fold.mask_shape((1, channels, p)), bool)
    step = fold.bind(v.reshape(1, channels, p), out, mask)  # may move the offset column
    np.matmul(fold.weights, np.vstack([cols, np.ones((1, p))]).astype(np.float64), out=v)
    step()
    acc = w.astype(np.int64) @ cols + bias[:, None]
    want = requantize(acc, reals, zo, lo, hi, channel_axis=0)
    np.testing.assert_array_equal(out[0], want)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from([3.1e-4, 0.25, 0.7, 1.0, 2.0**-9]),
    st.integers(-128, 127),
    st.sampled_from([(-128, 127), (-3, 60)]),
    st.sampled_from([(1, 1), (5, 4)]),
    st.booleans(),
)
def test_folded_one_output_and_float_outputs_equal_the_reference(
    seed, real, zo, clamp, shape, as_floats
):
    # A single output (Python floats) and float64 outputs minus lo (a folded consumer's
    # columns) give the two-step reference's bytes; column 0 (acc = bias, -3..2) holds
    # the negative ties.
    rng = np.random.default_rng(seed)
    (channels, p), k = shape, 6
    reals = real * rng.choice([1.0, 0.5, 2.0, 1.37], channels)
    bias = rng.integers(-3, 3, channels)
    w = rng.integers(-127, 128, (channels, k)).astype(np.int8)
    cols = rng.integers(-255, 256, (k, p))
    cols[:, 0] = 0
    lo, hi = clamp
    bound = 255 * int(np.abs(w.astype(np.int64)).sum(axis=1).max())
    fold = OutputStage(reals, bias, zo, lo, hi, bound, (channels, 1)).folded(w)
    assume(fold is not None)
    v = np.empty((1, channels, p))
    out = np.empty((1, channels, p), np.int8)
    floats = np.empty(v.shape) if as_floats else None
    step = fold.bind(v, out, np.empty(fold.mask_shape(v.shape), bool), floats)
    np.matmul(fold.weights, np.vstack([cols, np.ones((1, p))]), out=v[0])
    step()
    got = floats + lo if floats is not None else out
    acc = w.astype(np.int64) @ cols + bias[:, None]
    np.testing.assert_array_equal(got[0], requantize(acc, reals, zo, lo, hi, channel_axis=0))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_one_value_lookup_equals_the_table_at_every_byte(dtype):
    # A single 8-bit value is looked up in a Python list by the value itself; a negative
    # int8 value must land on its byte's entry, as the array path's take does.
    table = np.random.default_rng(0).integers(-128, 128, 256).astype(np.int8)
    x, out = np.zeros((1, 1), dtype), np.zeros((1, 1), np.int8)
    step = byte_lookup(table, x, out)
    for value in np.arange(256).astype(np.uint8).view(dtype):
        x[0, 0] = value
        step()
        assert out[0, 0] == table[int(value.view(np.uint8))]
