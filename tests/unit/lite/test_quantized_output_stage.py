"""The folded requantization (OutputStage) equals TFLite's two-step arithmetic (the int64
reference) on both of its routes, for multipliers below and above 1, exact powers of two,
negative ties, zero points and clamps."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
