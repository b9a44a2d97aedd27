"""Resize's cubic and antialiased filters and keep_aspect_ratio_policy, against
onnxruntime (the ONNX suite feeds their scales and sizes at run time; here they are
constants)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.converter.helpers import assert_matches_ort, helper, make_model


def _resize(shape, *, scales=None, sizes=None, axes=None, roi=(), **attrs):
    inits = {"roi": np.array(roi, np.float32)}
    inputs = ["x", "roi"]
    inits["scales"] = np.array(scales or [], np.float32)
    inputs.append("scales")
    if sizes is not None:
        inits["sizes"] = np.array(sizes, np.int64)
        inputs.append("sizes")
    if axes is not None:
        attrs["axes"] = axes
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    return make_model([node], {"x": shape}, ["y"], initializers=inits, opset=19)


X = np.random.default_rng(0).normal(size=(2, 3, 7, 9)).astype(np.float32)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"cubic_coeff_a": -0.5, "exclude_outside": 1},
        {"coordinate_transformation_mode": "align_corners"},
        {"coordinate_transformation_mode": "asymmetric"},
        {"coordinate_transformation_mode": "pytorch_half_pixel"},
    ],
    ids=str,
)
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 1.5], [1, 1, 0.6, 0.5]], ids=str)
def test_cubic_matches_onnxruntime(attrs, scales):
    model = _resize(X.shape, scales=scales, mode="cubic", **attrs)
    assert_matches_ort(model, {"x": X}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialiased_downscale_matches_onnxruntime(mode):
    model = _resize(X.shape, sizes=[2, 3, 3, 4], mode=mode, antialias=1)
    assert_matches_ort(model, {"x": X}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("sizes", [[5, 20], [14, 4]], ids=str)
def test_keep_aspect_ratio_policy_matches_onnxruntime(policy, sizes):
    model = _resize(
        X.shape, sizes=sizes, axes=[2, 3], mode="linear", keep_aspect_ratio_policy=policy
    )
    assert_matches_ort(model, {"x": X}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("extrapolation", [0.0, 10.0])
def test_tf_crop_and_resize_matches_onnxruntime(mode, extrapolation):
    model = _resize(
        X.shape,
        sizes=[5, 6],
        axes=[2, 3],
        roi=[0.3, -0.2, 1.1, 0.7],  # partly outside the input: extrapolated
        mode=mode,
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=extrapolation,
    )
    assert_matches_ort(model, {"x": X}, rtol=1e-4, atol=1e-5)
