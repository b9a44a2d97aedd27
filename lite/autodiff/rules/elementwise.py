"""Gradients of broadcasting binary ops (kernels: lite/kernels/elementwise.py).

Each input's gradient is summed back to that input's shape over the broadcast axes.
"""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.activation import through_fused_activation
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def add(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    a, b = node.inputs
    y = node.outputs[0]
    g = through_fused_activation(ctx, node, grads[0])
    return [
        ctx.sum_to(g, a, y) if ctx.needs(a) else None,
        ctx.sum_to(g, b, y) if ctx.needs(b) else None,
    ]


def sub(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    a, b = node.inputs
    y = node.outputs[0]
    g = through_fused_activation(ctx, node, grads[0])
    return [
        ctx.sum_to(g, a, y) if ctx.needs(a) else None,
        ctx.sum_to(ctx.op(OpCode.NEG, [g]), b, y) if ctx.needs(b) else None,
    ]


def mul(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    a, b = node.inputs
    y = node.outputs[0]
    g = through_fused_activation(ctx, node, grads[0])
    return [
        ctx.sum_to(ctx.op(OpCode.MUL, [g, b]), a, y) if ctx.needs(a) else None,
        ctx.sum_to(ctx.op(OpCode.MUL, [g, a]), b, y) if ctx.needs(b) else None,
    ]


def div(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # y = a / b: da = g / b, db = -g * a / b^2 = -(g / b) * y.
    a, b = node.inputs
    y = node.outputs[0]
    g = through_fused_activation(ctx, node, grads[0])
    g_over_b = ctx.op(OpCode.DIV, [g, b])
    da = ctx.sum_to(g_over_b, a, y) if ctx.needs(a) else None
    db = None
    if ctx.needs(b):
        # y is a / b unless a fused activation changed it; then recompute the quotient.
        q = y if node.attrs.get("activation", "none") == "none" else ctx.op(OpCode.DIV, [a, b])
        db = ctx.sum_to(ctx.op(OpCode.NEG, [ctx.op(OpCode.MUL, [g_over_b, q])]), b, y)
    return [da, db]


def _select(
    ctx: GradContext, node: Node, grads: list[int | None], compare: OpCode
) -> list[int | None]:
    # y = a where compare(a, b) else b: the gradient goes to the selected input (to b on
    # ties, where neither comparison holds).
    a, b = node.inputs
    y = node.outputs[0]
    g = through_fused_activation(ctx, node, grads[0])
    picked_a = ctx.op(compare, [a, b])
    zero = ctx.scalar(0.0, y)
    da = ctx.sum_to(ctx.op(OpCode.WHERE, [picked_a, g, zero]), a, y) if ctx.needs(a) else None
    db = ctx.sum_to(ctx.op(OpCode.WHERE, [picked_a, zero, g]), b, y) if ctx.needs(b) else None
    return [da, db]


def maximum(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return _select(ctx, node, grads, OpCode.GREATER)


def minimum(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return _select(ctx, node, grads, OpCode.LESS)
