"""3-D pools imported as two 2-D pools: outputs equal onnxruntime's; refusals are clear."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import ConversionError
from tests.unit.converter.helpers import assert_matches_ort, convert, helper, make_model

X = np.random.default_rng(0).normal(size=(2, 3, 6, 7, 5)).astype(np.float32)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
        ("MaxPool", {"kernel_shape": [2, 2, 2], "dilations": [2, 1, 2], "ceil_mode": 1}),
        ("AveragePool", {"kernel_shape": [3, 2, 3], "pads": [1, 1, 1, 1, 0, 1]}),
        (
            "AveragePool",
            {"kernel_shape": [3, 3, 2], "pads": [1, 1, 0, 1, 1, 1], "count_include_pad": 1},
        ),
        ("LpPool", {"kernel_shape": [2, 2, 2], "p": 3, "strides": [1, 2, 2]}),
    ],
    ids=str,
)
def test_3d_pool_matches_onnxruntime_with_a_dynamic_batch(op, attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = make_model([node], {"x": ["n", 3, 6, 7, 5]}, ["y"], opset=19)
    assert_matches_ort(model, {"x": X}, rtol=1e-5, atol=1e-5)


def test_3d_pool_refuses_same_padding_and_dynamic_spatial_sizes():
    same = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2], auto_pad="SAME_UPPER")
    with pytest.raises(ConversionError, match="auto_pad NOTSET and VALID, got 'SAME_UPPER'"):
        convert(make_model([same], {"x": [1, 3, 6, 7, 5]}, ["y"]))
    pool = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2])
    with pytest.raises(ConversionError, match="static channel and spatial sizes"):
        convert(make_model([pool], {"x": [1, 3, "d", 7, 5]}, ["y"]))
