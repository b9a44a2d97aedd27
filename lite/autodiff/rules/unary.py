"""Gradients of unary ops and activations (kernels: lite/kernels/unary.py).

Activations emit one ACTIVATION_GRAD node (lite/kernels/training/activation_grad.py); the
math ops are written with the elementwise ops themselves.
"""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def _activation(name: str, **fixed: object):
    def rule(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
        params = {k: node.attrs[k] for k in ("alpha", "beta", "approximate") if k in node.attrs}
        dx = ctx.op(
            OpCode.ACTIVATION_GRAD,
            [grads[0], node.inputs[0], node.outputs[0]],
            activation=name,
            **params,
            **fixed,
        )
        return [dx]

    rule.__name__ = name
    return rule


relu = _activation("relu")
relu6 = _activation("relu6")
sigmoid = _activation("sigmoid")
tanh = _activation("tanh")
hard_swish = _activation("hard_swish")
silu = _activation("silu")
hard_sigmoid = _activation("hard_sigmoid")
gelu = _activation("gelu")
elu = _activation("elu")
softplus = _activation("softplus")
abs_ = _activation("abs")


def leaky_relu(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    alpha = float(node.attrs.get("alpha", 0.01))
    return [
        ctx.op(
            OpCode.ACTIVATION_GRAD,
            [grads[0], node.inputs[0], node.outputs[0]],
            activation="leaky_relu",
            alpha=alpha,
        )
    ]


def clip(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    bounds = {}
    for k, (attr, name) in enumerate((("min", "clip_min"), ("max", "clip_max")), start=1):
        index = node.inputs[k] if len(node.inputs) > k else -1
        if index == -1:
            if attr in node.attrs:
                bounds[name] = float(node.attrs[attr])
            continue
        value = ctx.value(index)
        if value is None:
            raise UnsupportedOpError(
                f"CLIP {node.name!r}: no gradient with a bound computed at "
                "run time (bounds must be constants or attributes)"
            )
        bounds[name] = float(value.reshape(()))
    dx = ctx.op(
        OpCode.ACTIVATION_GRAD,
        [grads[0], node.inputs[0], node.outputs[0]],
        activation="clip",
        **bounds,
    )
    return [dx] + [None] * (len(node.inputs) - 1)


def neg(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return [ctx.op(OpCode.NEG, [grads[0]])]


def exp(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return [ctx.op(OpCode.MUL, [grads[0], node.outputs[0]])]


def log(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return [ctx.op(OpCode.DIV, [grads[0], node.inputs[0]])]


def sqrt(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # d sqrt(x) = 1 / (2 sqrt(x))
    y = node.outputs[0]
    return [ctx.scale(ctx.op(OpCode.DIV, [grads[0], y]), 0.5, y)]


def square(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    x = node.inputs[0]
    return [ctx.scale(ctx.op(OpCode.MUL, [grads[0], x]), 2.0, x)]


def reciprocal(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # d (1/x) = -1/x^2 = -y^2
    y = node.outputs[0]
    return [ctx.op(OpCode.NEG, [ctx.op(OpCode.MUL, [grads[0], ctx.op(OpCode.SQUARE, [y])])])]


def prelu(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # y = x where x >= 0 else slope * x (slope broadcasts to x).
    x, slope = node.inputs
    y = node.outputs[0]
    g = grads[0]
    negative = ctx.op(OpCode.LESS, [x, ctx.scalar(0.0, x)])
    dx = dslope = None
    if ctx.needs(x):
        dx = ctx.op(OpCode.WHERE, [negative, ctx.op(OpCode.MUL, [g, slope]), g])
    if ctx.needs(slope):
        masked = ctx.op(OpCode.WHERE, [negative, ctx.op(OpCode.MUL, [g, x]), ctx.scalar(0.0, x)])
        dslope = ctx.sum_to(masked, slope, y)
    return [dx, dslope]
