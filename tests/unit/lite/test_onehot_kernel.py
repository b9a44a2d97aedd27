"""The OneHot kernel (added with the converter) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.eager import run_op
from sporenet.lite.errors import ShapeError
from sporenet.lite.ops import OpCode
from tests.unit.lite.onnx_reference import run_onnx_op


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
def test_onehot_matches_onnxruntime(axis: int, dtype: type) -> None:
    # Negative indices count from the end; out-of-range ones (5, -6) give all-off rows.
    indices = np.array([[0, 3, -1], [5, -6, 2]], dtype)
    depth = np.array(5, dtype)  # onnxruntime implements OneHot for matching index/depth types
    values = np.array([-2.0, 7.5], np.float32)
    want = run_onnx_op(
        "OneHot", [indices, depth, values], initializers=(1, 2), opset=11, axis=axis
    )[0]
    got = run_op(OpCode.ONE_HOT, [indices, depth, values], axis=axis)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_onehot_rejects_bad_arguments() -> None:
    with pytest.raises(ShapeError, match="depth must be positive"):
        run_op(OpCode.ONE_HOT, [np.array([0]), np.array(0), np.array([0, 1])])
    with pytest.raises(ShapeError, match=r"values must hold \[off, on\]"):
        run_op(OpCode.ONE_HOT, [np.array([0]), np.array(3), np.array([0, 1, 2])])
    with pytest.raises(ShapeError, match="constant"):
        run_op(
            OpCode.ONE_HOT, [np.array([0]), np.array(3), np.array([0, 1])], constant_inputs=[0, 2]
        )
