"""BatchNorm (training and frozen), LayerNorm and Softmax/LogSoftmax gradients vs finite
differences and PyTorch; BatchNorm's running statistics."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import GradientCase, check_op, rand


def _F():
    import torch.nn.functional as F

    return F


def bn_params(c, seed=0):
    return {
        "scale": rand(c, seed=seed) + 1.5,
        "bias": rand(c, seed=seed + 1),
        "mean": rand(c, seed=seed + 2) * 0.1,
        "var": np.abs(rand(c, seed=seed + 3)) + 0.5,
    }


@pytest.mark.parametrize("shape", [(4, 3, 3, 3), (6, 4)])
def test_batch_norm_training(shape):
    def build(b, x, scale, bias, mean, var):
        return b.op_multi(OpCode.BATCH_NORM_TRAINING, [x, scale, bias, mean, var], 3, epsilon=1e-5)[
            0
        ]

    def torch_fn(x, scale, bias, mean, var):
        return _F().batch_norm(
            x, mean.detach().clone(), var.detach().clone(), scale, bias, training=True, eps=1e-5
        )

    check_op(
        build,
        {"x": rand(*shape, seed=1, scale=2) + 0.5},
        bn_params(shape[1]),
        wrt=["x", "scale", "bias"],
        torch_fn=torch_fn,
    )


def test_batch_norm_training_updates_running_statistics_like_pytorch():
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    x = rand(5, 3, 2, 2, seed=1) + 1.0
    params = bn_params(3)
    case = GradientCase(
        lambda b, x, scale, bias, mean, var: b.op_multi(
            OpCode.BATCH_NORM_TRAINING, [x, scale, bias, mean, var], 3, momentum=0.25
        )[0],
        {"x": x},
        params,
        wrt=["x"],
    )
    case.run()
    rm, rv = torch.tensor(params["mean"]), torch.tensor(params["var"])
    _F().batch_norm(torch.tensor(x), rm, rv, training=True, momentum=0.25)
    np.testing.assert_allclose(case.variables[case.ids["mean"]], rm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(case.variables[case.ids["var"]], rv.numpy(), rtol=1e-12)


def test_frozen_batch_norm():
    # Inference form (running statistics): the transfer-learning case.
    check_op(
        lambda b, x, scale, bias, mean, var: b.op(OpCode.BATCH_NORM, [x, scale, bias, mean, var]),
        {"x": rand(2, 3, 2, 2, seed=1)},
        bn_params(3),
        wrt=["x", "scale", "bias"],
        torch_fn=lambda x, scale, bias, mean, var: _F().batch_norm(
            x, mean, var, scale, bias, training=False, eps=1e-5
        ),
    )


@pytest.mark.parametrize(("shape", "axis"), [((4, 6), -1), ((2, 3, 4), 1)])
def test_layer_norm(shape, axis):
    normalized = shape[axis % len(shape) :]
    check_op(
        lambda b, x, scale, bias: b.op(OpCode.LAYER_NORM, [x, scale, bias], axis=axis),
        {"x": rand(*shape, seed=1, scale=2)},
        {"scale": rand(*normalized, seed=2) + 1, "bias": rand(*normalized, seed=3)},
        torch_fn=lambda x, scale, bias: _F().layer_norm(x, normalized, scale, bias, 1e-5),
    )


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax(axis):
    check_op(
        lambda b, x: b.op(OpCode.SOFTMAX, [x], axis=axis),
        {"x": rand(3, 5, seed=1)},
        torch_fn=lambda x: x.softmax(axis),
    )


@pytest.mark.parametrize("axis", [-1, 1])
def test_log_softmax(axis):
    check_op(
        lambda b, x: b.op(OpCode.LOG_SOFTMAX, [x], axis=axis),
        {"x": rand(2, 4, 3, seed=1)},
        torch_fn=lambda x: x.log_softmax(axis),
    )


def test_layer_norm_with_broadcast_scale_and_bias():
    # Normalized over (3, 4) with per-feature (4,) scale and bias: their gradients are
    # summed over the broadcast axis too.
    check_op(
        lambda b, x, scale, bias: b.op(OpCode.LAYER_NORM, [x, scale, bias], axis=1),
        {"x": rand(2, 3, 4, seed=1, scale=2)},
        {"scale": rand(4, seed=2) + 1, "bias": rand(4, seed=3)},
        torch_fn=lambda x, scale, bias: _F().layer_norm(
            x, (3, 4), scale.expand(3, 4), bias.expand(3, 4), 1e-5
        ),
    )
