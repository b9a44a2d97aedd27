"""MaxPool's Indices output (flat positions of the maxima) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import ShapeError
from sporenet.lite.eager import run_op
from sporenet.lite.ops import OpCode
from tests.unit.converter.helpers import assert_matches_ort, helper, make_model

X = np.random.default_rng(0).normal(size=(2, 3, 7, 6)).astype(np.float32)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
        {"kernel_shape": [2, 3], "dilations": [2, 1]},
    ],
    ids=str,
)
def test_indices_match_onnxruntime(attrs, storage_order):
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], storage_order=storage_order, **attrs)
    model = make_model([node], {"x": list(X.shape)}, ["y", "i"], opset=12)
    assert_matches_ort(model, {"x": X})


def test_1d_indices_match_onnxruntime():
    x = X[:, :, 0, :].copy()
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2], strides=[2])
    model = make_model([node], {"x": list(x.shape)}, ["y", "i"], opset=12)
    assert_matches_ort(model, {"x": x})


def test_storage_order_is_checked():
    with pytest.raises(ShapeError, match="storage_order must be 0 or 1, got 2"):
        run_op(OpCode.MAX_POOL2D, [X], kernel_shape=[2, 2], storage_order=2)
