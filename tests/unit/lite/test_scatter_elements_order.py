"""SCATTER_ELEMENTS combines duplicate positions one update after another, in the updates'
order: checked against a Python loop doing exactly that, in float32, on every axis."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from sporenet.lite.eager import run_op

_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _sequential(data, indices, updates, axis: int, reduction: str) -> np.ndarray:
    out = data.copy()
    for p in np.ndindex(indices.shape):
        q = list(p)
        q[axis] = int(indices[p]) % data.shape[axis]
        q_ = tuple(q)
        if reduction == "none":
            out[q_] = updates[p]
        else:
            out[q_] = _UFUNCS[reduction](out[q_], updates[p])
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_duplicates_combine_in_the_updates_order(axis: int, reduction: str) -> None:
    rng = np.random.default_rng(7)
    data = rng.standard_normal((5, 4, 3)).astype(np.float32)
    shape = [d - 1 for d in data.shape]  # shorter than data off the axis
    shape[axis] = 9  # more updates than positions along the axis: many duplicates
    dim = data.shape[axis]
    indices = rng.integers(-dim, dim, size=shape).astype(np.int64)
    updates = (rng.standard_normal(shape) * 1e3).astype(np.float32)
    (ours,) = run_op(
        OpCode.SCATTER_ELEMENTS, [data, indices, updates], axis=axis, reduction=reduction
    )
    want = _sequential(data, indices, updates, axis % 3, reduction)
    np.testing.assert_array_equal(ours, want)
