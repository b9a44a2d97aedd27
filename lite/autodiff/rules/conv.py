"""Gradient of Conv2D (kernel: lite/kernels/conv.py; backward: kernels/training/conv_grad.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.activation import through_fused_activation
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode

WINDOW_ATTRS = ("strides", "dilations", "pads", "auto_pad", "group")


def conv2d(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    x, w = node.inputs[:2]
    b = node.inputs[2] if len(node.inputs) > 2 else -1
    g = through_fused_activation(ctx, node, grads[0])
    attrs = {k: node.attrs[k] for k in WINDOW_ATTRS if k in node.attrs}
    dx = ctx.op(OpCode.CONV2D_BACKPROP_INPUT, [g, w, x], **attrs) if ctx.needs(x) else None
    dw = ctx.op(OpCode.CONV2D_BACKPROP_FILTER, [g, x, w], **attrs) if ctx.needs(w) else None
    db = ctx.op(OpCode.REDUCE_SUM, [g], axes=[0, 2, 3], keepdims=0) if ctx.needs(b) else None
    return [dx, dw, db][: len(node.inputs)]
