"""Sigmoid (the op and the fused activation) and Rsqrt on one-element tensors take a
scalar path: its results are the float64 values rounded once to the dtype, special
values (NaN, infinities, zero, negatives, exp past float64's range) give what the array
path gives, and no NumPy warning is raised."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.eager import run_op
from sporenet.lite.planner import plan

DTYPES = [np.float16, np.float32, np.float64]
SIGMOID_INPUTS = [-1000.0, -745.5, -120.0, -3.25, -0.0, 0.0, 0.3, 17.0, 1000.0]
SPECIAL = [np.nan, np.inf, -np.inf]


def _sigmoid64(v: float) -> float:
    try:
        return 1.0 / (1.0 + math.exp(-v))
    except OverflowError:
        return 0.0


def _fc_sigmoid(dtype: type) -> np.ndarray:
    """A planned x (1, 1) -> FULLY_CONNECTED (weight 1, fused sigmoid) -> (1, 1) model."""
    b = ModelBuilder()
    x = b.input("x", (1, 1), dtype)
    y = b.op(
        OpCode.FULLY_CONNECTED, [x, b.constant("w", np.ones((1, 1)), dtype)], activation="sigmoid"
    )
    b.output(y, "y")
    return b.build()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", SIGMOID_INPUTS + SPECIAL)
def test_one_element_sigmoid_is_the_float64_value_rounded_once(dtype, value):
    x = np.array([[value]], dtype)
    want = np.array([[_sigmoid64(float(x.item()))]]).astype(dtype)
    model = _fc_sigmoid(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (op,) = run_op(OpCode.SIGMOID, [x])
        p = plan(model, "infer")
        np.copyto(p.arrays[model.graphs[0].inputs[0]], x)
        p.run()
        fused = p.arrays[model.graphs[0].outputs[0]]
    np.testing.assert_array_equal(op, want)
    np.testing.assert_array_equal(fused, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_element_sigmoid_agrees_with_the_array_path(dtype):
    values = np.array(SIGMOID_INPUTS + SPECIAL, dtype)
    (array_path,) = run_op(OpCode.SIGMOID, [values])
    with np.errstate(all="ignore"):
        for v, a in zip(values, array_path, strict=True):
            (one,) = run_op(OpCode.SIGMOID, [np.array([v], dtype)])
            # Both within an ulp of the exact value: at most one apart.
            np.testing.assert_allclose(one[0], a, rtol=float(np.finfo(dtype).eps), atol=0)


RSQRT_INPUTS = [1e-30, 0.01, 0.5, 2.0, 3.0, 1e30, np.inf, 0.0, -0.0, -4.0, np.nan]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", RSQRT_INPUTS)
def test_one_element_rsqrt_matches_the_float64_value_and_ieee_special_cases(dtype, value):
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        x = np.array([[value]]).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = run_op(OpCode.RSQRT, [x])
    with np.errstate(all="ignore"):
        want = (1.0 / np.sqrt(x.astype(np.float64))).astype(dtype)
    # float64: the same two roundings as the array path; narrower dtypes: rounded once
    # from float64, within half an ulp.
    np.testing.assert_array_equal(got, want)
