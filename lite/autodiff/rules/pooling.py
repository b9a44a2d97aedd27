"""Gradients of the pools (kernels: lite/kernels/pooling.py; backward: training/pool_grad.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def max_pool2d(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # With routing=1 (a training graph's forward) output 1 is the routing mask: the
    # gradient reads it instead of finding each window's first maximum again.
    # A mask made with positive_only=1 routes only positive maxima (the derivative of a
    # ReLU after the pool folded in): y's own gradient then finds the maxima again.
    x, y = node.inputs[0], node.outputs[0]
    inputs = [grads[0], x, y]
    if node.attrs.get("routing", 0) and not node.attrs.get("positive_only", 0):
        inputs.append(node.outputs[1])
    attrs = {k: v for k, v in node.attrs.items() if k not in ("routing", "positive_only")}
    return [ctx.op(OpCode.MAX_POOL2D_GRAD, inputs, **attrs)]


def avg_pool2d(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return [ctx.op(OpCode.AVG_POOL2D_GRAD, [grads[0], node.inputs[0]], **node.attrs)]


def global_avg_pool(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    x = node.inputs[0]
    spatial = list(range(2, ctx.rank(x)))
    return [ctx.op(OpCode.REDUCE_GRAD, [grads[0], x], axes=spatial, keepdims=1, reduction="mean")]


def global_max_pool(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # A max pool whose one window is the whole plane.
    x = node.inputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4 or -1 in shape[2:]:
        raise UnsupportedOpError(
            f"GLOBAL_MAX_POOL {node.name!r}: gradients need a 4-D input "
            f"with a known plane size, got {list(shape)}"
        )
    plane = [int(shape[2]), int(shape[3])]
    return [
        ctx.op(
            OpCode.MAX_POOL2D_GRAD,
            [grads[0], x, node.outputs[0]],
            kernel_shape=plane,
            strides=plane,
        )
    ]
