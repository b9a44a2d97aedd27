"""Broadcasting Add/Sub/Mul/Div gradients vs finite differences and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import OpCode
from tests.unit.autodiff.gradcheck import GradientCase, check_op, rand

SHAPES = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),  # trailing broadcast: b's gradient sums the leading axes
    ((2, 3, 4), (3, 1)),  # middle broadcast with a size-1 axis
    ((1, 4), (3, 1)),  # both sides broadcast
]

OPS = {
    OpCode.ADD: lambda a, b: a + b,
    OpCode.SUB: lambda a, b: a - b,
    OpCode.MUL: lambda a, b: a * b,
    OpCode.DIV: lambda a, b: a / b,
}


@pytest.mark.parametrize("op", list(OPS), ids=lambda op: op.name)
@pytest.mark.parametrize(("sa", "sb"), SHAPES)
def test_binary(op, sa, sb):
    b_value = rand(*sb, seed=2)
    if op == OpCode.DIV:
        # Keep divisors away from 0, where the quotient and its derivative blow up.
        b_value = np.sign(b_value) * (np.abs(b_value) + 0.5)
    check_op(
        lambda bld, a, b: bld.op(op, [a, b]),
        {"a": rand(*sa, seed=1)},
        {"b": b_value},
        torch_fn=OPS[op],
    )


def test_same_tensor_on_both_sides_accumulates():
    # x * x: both inputs are x, so the engine must add the two contributions (2x).
    check_op(
        lambda bld, x: bld.op(OpCode.MUL, [x, x]),
        {"x": rand(3, 4, seed=1)},
        torch_fn=lambda x: x * x,
    )


def test_fused_relu_on_add():
    x = rand(3, 4, seed=1)
    b = rand(4, seed=2)
    # Keep x + b away from 0, the kink of relu.
    x = x + np.where(np.abs(x + b) < 0.1, 0.3, 0.0)
    check_op(
        lambda bld, x, b: bld.op(OpCode.ADD, [x, b], activation="relu"),
        {"x": x},
        {"b": b},
        torch_fn=lambda x, b: (x + b).relu(),
    )


@pytest.mark.parametrize("op", [OpCode.MAXIMUM, OpCode.MINIMUM], ids=lambda op: op.name)
def test_maximum_minimum(op):
    def fn(a, b):
        import torch

        return torch.maximum(a, b) if op == OpCode.MAXIMUM else torch.minimum(a, b)

    # Random values: no ties, so each output has one well-defined source.
    check_op(
        lambda bld, a, b: bld.op(op, [a, b]),
        {"a": rand(2, 3, 4, seed=1)},
        {"b": rand(3, 1, seed=2)},
        torch_fn=fn,
    )


def _broadcast_pair(draw_shape, mask):
    """A shape and a broadcast-compatible partner: some axes set to 1, leading ones cut."""
    other = [1 if m else d for d, m in zip(draw_shape, mask, strict=True)]
    return tuple(draw_shape), tuple(other)


@pytest.mark.parametrize("op", [OpCode.ADD, OpCode.MUL], ids=lambda op: op.name)
def test_broadcast_gradients_property(op):
    # Property: for random broadcast-compatible shapes, the IR gradient of each input equals
    # NumPy's analytic gradient summed over the axes that input was broadcast along.
    hypothesis = pytest.importorskip("hypothesis", reason="Hypothesis is a test extra")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=15, deadline=None)
    @hypothesis.given(
        st.lists(st.integers(1, 3), min_size=1, max_size=4).flatmap(
            lambda s: st.tuples(
                st.just(s),
                st.lists(st.booleans(), min_size=len(s), max_size=len(s)),
                st.integers(0, len(s)),
            )
        )
    )
    def check(args):
        shape, mask, cut = args
        sa, sb = _broadcast_pair(shape, mask)
        sb = sb[cut:] or (1,)
        a, b = rand(*sa, seed=1), rand(*sb, seed=2)
        case = GradientCase(lambda bld, a, b: bld.op(op, [a, b]), {"a": a}, {"b": b})
        grads = case.gradients()
        y = a + b if op == OpCode.ADD else a * b
        dy = 2 * (y - case.target) / y.size
        da = dy if op == OpCode.ADD else dy * b
        db = dy if op == OpCode.ADD else dy * a
        lead = len(y.shape) - len(sb)
        axes = tuple(range(lead)) + tuple(
            lead + k for k, d in enumerate(sb) if d == 1 and y.shape[lead + k] != 1
        )
        # a has the full shape; b was broadcast along `axes`.
        np.testing.assert_allclose(grads["a"], da, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(
            grads["b"], db.sum(axis=axes).reshape(sb), rtol=1e-10, atol=1e-14
        )

    check()
