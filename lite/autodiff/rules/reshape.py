"""Gradients of view ops: Reshape, Flatten, Identity (kernels: lite/kernels/reshape.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def reshape_back(ctx: GradContext, grad: int, x: int, what: str) -> int:
    """`grad` reshaped to x's shape (its one dynamic dimension, if any, inferred)."""
    shape = list(ctx.shape(x))
    if shape.count(-1) > 1:
        raise UnsupportedOpError(
            f"{what}: no gradient for an input with several dynamic dimensions {shape}"
        )
    return ctx.op(OpCode.RESHAPE, [grad], shape=shape)


def reshape(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    dx = reshape_back(ctx, grads[0], node.inputs[0], f"{node.op.name} {node.name!r}")
    return [dx] + [None] * (len(node.inputs) - 1)


def identity(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    return [grads[0]]
