"""Gradients of FullyConnected and MatMul (kernels: lite/kernels/linear.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.engine import GradContext
from sporenet.lite.autodiff.rules.activation import through_fused_activation
from sporenet.lite.errors import ShapeError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def fully_connected(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # y = x @ W.T + b: dx = g @ W, dW = g2.T @ x2 (batch axes flattened), db = sum(g).
    x, w = node.inputs[:2]
    b = node.inputs[2] if len(node.inputs) > 2 else -1
    y = node.outputs[0]
    g = through_fused_activation(ctx, node, grads[0])
    dx = ctx.op(OpCode.MATMUL, [g, w]) if ctx.needs(x) else None
    dw = None
    if ctx.needs(w):
        g2, x2 = g, x
        if ctx.rank(y) != 2:
            out_features, in_features = ctx.shape(w)
            g2 = ctx.op(OpCode.RESHAPE, [g], shape=[-1, out_features])
            x2 = ctx.op(OpCode.RESHAPE, [x], shape=[-1, in_features])
        dw = ctx.op(OpCode.MATMUL_TRANSPOSED, [g2, x2], transpose_a=1)
    db = ctx.op(OpCode.REDUCE_SUM_TO, [g, b]) if ctx.needs(b) else None
    return [dx, dw, db][:len(node.inputs)]


def matmul(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # y = a @ b: da = g @ b^T, db = a^T @ g, summed over batch axes that were broadcast.
    a, b = node.inputs
    y = node.outputs[0]
    (g,) = grads
    if ctx.rank(a) < 2 or ctx.rank(b) < 2:
        raise ShapeError(f"MATMUL {node.name!r}: gradients need inputs of rank >= 2, got "
                         f"{list(ctx.shape(a))} and {list(ctx.shape(b))}")
    batch = ctx.shape(y)[:-2]
    da = db = None
    if ctx.needs(a):
        da = ctx.op(OpCode.MATMUL_TRANSPOSED, [g, b], transpose_b=1)
        if ctx.shape(a)[:-2] != batch:
            da = ctx.op(OpCode.REDUCE_SUM_TO, [da, a])
    if ctx.needs(b):
        db = ctx.op(OpCode.MATMUL_TRANSPOSED, [a, g], transpose_a=1)
        if ctx.shape(b)[:-2] != batch:
            db = ctx.op(OpCode.REDUCE_SUM_TO, [db, b])
    return [da, db]
