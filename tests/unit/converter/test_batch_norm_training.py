"""BatchNormalization with training_mode=1: batch statistics and updated running ones."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import ConversionError
from tests.unit.converter.helpers import convert, helper, make_model, run_spore


def _model(outputs, shape=(4, 3, 5, 2)):
    node = helper.make_node(
        "BatchNormalization",
        ["x", "s", "b", "mean", "var"],
        outputs,
        training_mode=1,
        momentum=0.8,
        epsilon=1e-3,
    )
    inputs = {"x": list(shape), "s": [3], "b": [3], "mean": [3], "var": [3]}
    declared = {"y": list(shape), "rm": [3], "rv": [3]}
    return make_model(
        [node], inputs, outputs, opset=15, output_shapes={o: declared[o] for o in outputs}
    )


def test_outputs_match_a_numpy_reference():
    rng = np.random.default_rng(0)
    feeds = {k: rng.normal(size=n).astype(np.float32) for k, n in (("s", 3), ("b", 3))}
    feeds["x"] = rng.normal(size=(4, 3, 5, 2)).astype(np.float32)
    feeds["mean"], feeds["var"] = np.zeros(3, np.float32), np.ones(3, np.float32)
    y, running_mean, running_var = run_spore(_model(["y", "rm", "rv"]), feeds)
    mean = feeds["x"].mean(axis=(0, 2, 3))
    var = feeds["x"].var(axis=(0, 2, 3))
    shaped = (1, 3, 1, 1)
    want = (feeds["x"] - mean.reshape(shaped)) / np.sqrt(var.reshape(shaped) + 1e-3)
    want = want * feeds["s"].reshape(shaped) + feeds["b"].reshape(shaped)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(running_mean, 0.2 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(running_var, 0.8 + 0.2 * var, rtol=1e-5)
    (only_y,) = run_spore(_model(["y"]), feeds)
    np.testing.assert_array_equal(only_y, y)


def test_dynamic_channels_are_refused():
    with pytest.raises(ConversionError, match="static channel count"):
        convert(_model(["y"], shape=(4, "c", 5, 2)))
