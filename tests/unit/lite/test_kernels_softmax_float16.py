"""float16 Softmax and LogSoftmax compute in float32 and round once: every output is the
float64 reference rounded to float16, within float32's own rounding."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.kernels.softmax import _narrow

CASES = [
    ((1, 27, 20), 1),  # slovorez's middle axis
    ((1, 27, 20), -1),  # short last axis: slice by slice
    ((1, 27, 20), 0),
    ((4, 3, 50, 7), 2),
    ((2, 300), 1),
    ((9,), 0),
]


EPS32 = float(np.finfo(np.float32).eps)


def _half_ulp_close(actual: np.ndarray, ref: np.ndarray, float32_error: np.ndarray) -> None:
    """|actual - ref| at most half a float16 step of ref (a correct rounding) plus the
    error bound of the float32 steps before it."""
    assert actual.dtype == np.float16
    step = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float64)
    bound = 0.5 * step + float32_error
    assert (np.abs(actual.astype(np.float64) - ref) <= bound).all()


@pytest.mark.parametrize("scale", [4, 12])  # 12: many results among float16 subnormals
@pytest.mark.parametrize(("shape", "axis"), CASES, ids=str)
def test_float16_softmax_is_the_reference_rounded_once(shape, axis, scale):
    x = np.random.default_rng(5).normal(scale=scale, size=shape).astype(np.float16)
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=axis, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    (sm,) = run_op(OpCode.SOFTMAX, [x], axis=axis)
    (lsm,) = run_op(OpCode.LOG_SOFTMAX, [x], axis=axis)
    probabilities, logs = np.exp(shifted - log_total), shifted - log_total
    # float32: a few ulps relative for a probability; for its logarithm a few ulps of
    # |x - max| and of the sum (>= 1) whose logarithm is taken.
    _half_ulp_close(sm, probabilities, 4 * EPS32 * probabilities)
    _half_ulp_close(lsm, logs, 4 * EPS32 * (1 + np.abs(shifted) + np.abs(log_total)))
    if scale == 12 and x.shape[axis] >= 7:
        assert ((sm > 0) & (sm < np.finfo(np.float16).tiny)).any()


def test_float16_narrowing_rounds_subnormals_as_the_cast_does():
    # Every float32 in float16's subnormal range and around its smallest normal, both
    # signs (halfway values included): the same float16 as NumPy's own cast.
    tiny = float(np.finfo(np.float16).tiny)
    steps = np.arange(0, 2**11, 0.25) * 2.0**-24
    values = np.concatenate([steps, np.nextafter(np.float32(tiny), 0) * np.ones(1)])
    wide = values.astype(np.float32)
    for sign in (1.0, -1.0):
        out = np.empty(wide.shape, np.float16)
        signed = (sign * wide).astype(np.float32)
        _narrow(signed.copy(), out, sign)()
        assert np.array_equal(out.view(np.uint16), signed.astype(np.float16).view(np.uint16))
        assert (out != 0).sum() > 1000


def test_float16_input_is_not_overwritten_and_calls_repeat():
    x = np.random.default_rng(6).normal(scale=4, size=(2, 5, 3)).astype(np.float16)
    kept = x.copy()
    first = run_op(OpCode.LOG_SOFTMAX, [x], axis=1)[0]
    assert np.array_equal(x, kept)
    assert np.array_equal(run_op(OpCode.LOG_SOFTMAX, [x], axis=1)[0], first)
