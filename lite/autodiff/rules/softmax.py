"""Gradients of Softmax and LogSoftmax (kernels: lite/kernels/softmax.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def softmax(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    axis = int(node.attrs.get("axis", -1))
    return [ctx.op(OpCode.SOFTMAX_GRAD, [grads[0], node.outputs[0]], axis=axis)]


def log_softmax(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    axis = int(node.attrs.get("axis", -1))
    return [ctx.op(OpCode.SOFTMAX_GRAD, [grads[0], node.outputs[0]], axis=axis, log=1)]
