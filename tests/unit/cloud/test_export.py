"""export(): the saved inference file reproduces the cloud model's eval outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud.datasets import load_digits
from sporenet.cloud.errors import ExportError
from sporenet.lite import Interpreter, OpCode, load

RNG = np.random.default_rng(3)


def _cnn() -> cloud.Sequential:
    cloud.manual_seed(1)
    net = cloud.Sequential(
        L.Rescale(1 / 16),
        L.Conv2d(1, 8, 3, padding=1),
        L.BatchNorm2d(8),
        L.ReLU(),
        L.MaxPool2d(2),
        L.DepthwiseConv2d(8, 3, padding=1, bias=False),
        L.BatchNorm2d(8),
        L.ReLU6(),
        L.Dropout(0.3),
        L.Flatten(),
        L.Dense(128, 10),
    )
    for bn in (net[2], net[6]):  # non-trivial statistics so folding is really exercised
        bn.running_mean.value[:] = RNG.normal(size=8)
        bn.running_var.value[:] = RNG.uniform(0.5, 2.0, size=8)
        bn.weight.value[:] = RNG.uniform(0.5, 1.5, size=8)
        bn.bias.value[:] = RNG.normal(size=8)
    return net


def test_export_round_trip_matches_eval_outputs(tmp_path):
    net = _cnn()
    x = load_digits().x_test[:32]
    path = tmp_path / "digits.spore"
    cloud.export(
        net,
        path,
        input_shape=(1, 8, 8),
        labels=[str(d) for d in range(10)],
        input_range=(0.0, 16.0),
    )
    assert net.training  # export leaves the module's mode alone
    expected = net.eval()(x)
    model = load(path)
    ops = [n.op for n in model.graphs[0].nodes]
    assert OpCode.BATCH_NORM not in ops  # folded into the convolutions
    assert OpCode.DROPOUT not in ops
    assert json.loads(model.metadata["labels"]) == [str(d) for d in range(10)]
    assert json.loads(model.metadata["input"])["shape"] == [-1, 1, 8, 8]
    out = Interpreter(model_path=path).run({"input": x})
    assert list(out) == ["logits", "probabilities"]
    np.testing.assert_allclose(out["logits"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-6)


def test_folding_keeps_the_parameters_names_and_drops_the_statistics(tmp_path):
    # Export runs the converter's BatchNorm folding: weights are rewritten in place, and
    # unnamed layers of a Sequential are named after their type and position.
    model = cloud.export(_cnn(), tmp_path / "m.spore", input_shape=(1, 8, 8))
    constants = {t.name for t in model.tensors if t.data is not None}
    assert {"conv2d1.weight", "conv2d1.bias", "dense10.weight", "dense10.bias"} <= constants
    assert not [n for n in constants if "batchnorm" in n]  # the BatchNorms' parameters
    # The depthwise convolution had no bias: folding gives it one, named as its layer's.
    assert sorted(n for n in constants if n.startswith("depthwiseconv2d5.")) == [
        "depthwiseconv2d5.bias",
        "depthwiseconv2d5.weight",
    ]


def test_export_without_folding_keeps_inference_batchnorm(tmp_path):
    net = _cnn()
    model = cloud.export(
        net, tmp_path / "m.spore", input_shape=(1, 8, 8), fold_batch_norm=False, probabilities=False
    )
    assert [n.op for n in model.graphs[0].nodes].count(OpCode.BATCH_NORM) == 2
    x = load_digits().x_test[:8]
    out = Interpreter(model_path=tmp_path / "m.spore").run({"input": x})
    np.testing.assert_allclose(out["logits"], net.eval()(x), rtol=1e-5, atol=1e-5)


def test_export_needs_an_input_shape(tmp_path):
    with pytest.raises(ExportError, match="input_shape"):
        cloud.export(L.Dense(4, 2), tmp_path / "m.spore")
