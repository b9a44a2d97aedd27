"""FullyConnected and MatMul gradients vs finite differences and PyTorch."""

from __future__ import annotations

import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import check_op, rand


def torch_linear(x, w, b=None, activation=None):
    import torch.nn.functional as F

    y = F.linear(x, w, b)
    return {None: y, "relu": F.relu(y), "tanh": y.tanh(), "sigmoid": y.sigmoid()}[activation]


@pytest.mark.parametrize("activation", [None, "relu", "tanh", "sigmoid"])
def test_fully_connected(activation):
    attrs = {"activation": activation} if activation else {}
    check_op(
        lambda b, x, w, bias: b.op(OpCode.FULLY_CONNECTED, [x, w, bias], **attrs),
        {"x": rand(5, 4, seed=1)},
        {"w": rand(3, 4, seed=2), "bias": rand(3, seed=3)},
        torch_fn=lambda x, w, bias: torch_linear(x, w, bias, activation),
    )


def test_fully_connected_without_bias_on_a_3d_input():
    # Batch axes are flattened for the weight gradient.
    check_op(
        lambda b, x, w: b.op(OpCode.FULLY_CONNECTED, [x, w]),
        {"x": rand(2, 3, 4, seed=1)},
        {"w": rand(5, 4, seed=2)},
        torch_fn=lambda x, w: torch_linear(x, w),
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 3, 4), (4, 5)),  # b broadcast over the batch: its gradient is summed
        ((1, 3, 4), (2, 4, 5)),  # a broadcast
        ((4,), (2, 4, 5)),  # 1-D operands are promoted to matrices (NumPy rules)
        ((2, 3, 4), (4,)),
        ((4,), (4,)),
    ],
)
def test_matmul(a, b):
    check_op(
        lambda bld, a, b: bld.op(OpCode.MATMUL, [a, b]),
        {"a": rand(*a, seed=1)},
        {"b": rand(*b, seed=2)},
        torch_fn=lambda a, b: a @ b,
    )
