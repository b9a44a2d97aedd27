"""Gradients of FullyConnected and MatMul (kernels: lite/kernels/linear.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
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
    return [dx, dw, db][: len(node.inputs)]


def matmul(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # y = a @ b: da = g @ b^T, db = a^T @ g, summed over batch axes that were broadcast.
    # A 1-D operand is promoted to a matrix (NumPy's rule) and its gradient reshaped back.
    a, b = node.inputs
    y = node.outputs[0]
    (g,) = grads
    sa, sb, sy = ctx.shape(a), ctx.shape(b), ctx.shape(y)
    if len(sa) == 0 or len(sb) == 0:
        raise ShapeError(f"MATMUL {node.name!r}: no gradient for scalar operands")
    a2, b2, g2, sy2 = a, b, g, list(sy)
    if len(sa) == 1:
        a2 = ctx.op(OpCode.RESHAPE, [a], shape=[1, sa[0]])
        sy2.insert(len(sy2) - (0 if len(sb) == 1 else 1), 1)
    if len(sb) == 1:
        b2 = ctx.op(OpCode.RESHAPE, [b], shape=[sb[0], 1])
        sy2.append(1)
    if a2 != a or b2 != b:
        if sy2.count(-1) > 1:
            raise ShapeError(
                f"MATMUL {node.name!r}: no gradient with several dynamic dimensions {sy}"
            )
        g2 = ctx.op(OpCode.RESHAPE, [g], shape=sy2)
    batch = tuple(sy2[:-2])
    da = db = None
    if ctx.needs(a):
        da = ctx.op(OpCode.MATMUL_TRANSPOSED, [g2, b2], transpose_b=1)
        if tuple(sa[:-2]) != batch:  # a was broadcast over batch axes (a 1-D a has none)
            da = ctx.op(OpCode.REDUCE_SUM_TO, [da, a2])
        if len(sa) == 1:
            da = ctx.op(OpCode.RESHAPE, [da], shape=list(sa))
    if ctx.needs(b):
        db = ctx.op(OpCode.MATMUL_TRANSPOSED, [a2, g2], transpose_a=1)
        if tuple(sb[:-2]) != batch:
            db = ctx.op(OpCode.REDUCE_SUM_TO, [db, b2])
        if len(sb) == 1:
            db = ctx.op(OpCode.RESHAPE, [db], shape=list(sb))
    return [da, db]
