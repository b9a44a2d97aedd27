"""Gradient of Conv2D (kernel: lite/kernels/conv.py; backward: kernels/training/conv_grad.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.activation import through_fused_activation
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode

WINDOW_ATTRS = ("strides", "dilations", "pads", "auto_pad", "group")


def window_attrs(node: Node) -> dict:
    """The attributes that fix a convolution's geometry, which its gradients share."""
    return {k: node.attrs[k] for k in WINDOW_ATTRS if k in node.attrs}


def conv_from(ctx: GradContext, role: str, operands: dict[str, int], like: int, attrs: dict) -> int:
    """One of the three tensors a convolution relates, input x, filter w and output y,
    from the other two: y = CONV2D(x, w), x = CONV2D_BACKPROP_INPUT(y, w) and w =
    CONV2D_BACKPROP_FILTER(y, x), each bilinear (`like` lends the result its shape)."""
    if role == "y":
        return ctx.op(OpCode.CONV2D, [operands["x"], operands["w"]], **attrs)
    if role == "x":
        return ctx.op(OpCode.CONV2D_BACKPROP_INPUT, [operands["y"], operands["w"], like], **attrs)
    return ctx.op(OpCode.CONV2D_BACKPROP_FILTER, [operands["y"], operands["x"], like], **attrs)


def conv2d(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    x, w = node.inputs[:2]
    b = node.inputs[2] if len(node.inputs) > 2 else -1
    g = through_fused_activation(ctx, node, grads[0])
    attrs = window_attrs(node)
    dx = conv_from(ctx, "x", {"y": g, "w": w}, x, attrs) if ctx.needs(x) else None
    dw = conv_from(ctx, "w", {"y": g, "x": x}, w, attrs) if ctx.needs(w) else None
    db = ctx.op(OpCode.REDUCE_SUM, [g], axes=[0, 2, 3], keepdims=0) if ctx.needs(b) else None
    return [dx, dw, db][: len(node.inputs)]
