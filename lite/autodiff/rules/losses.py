"""Gradients of the losses (kernels: lite/kernels/training/losses.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def _no_label_gradient(ctx: GradContext, node: Node) -> None:
    if ctx.needs(node.inputs[1]):
        raise UnsupportedOpError(
            f"{node.op.name} {node.name!r}: no gradient with respect to the labels/targets"
        )


def softmax_cross_entropy(
    ctx: GradContext, node: Node, grads: list[int | None]
) -> list[int | None]:
    _no_label_gradient(ctx, node)
    logits, labels = node.inputs
    # The forward node's output 1 holds the probabilities; without it, recompute them.
    has_probs = len(node.outputs) > 1
    probs = node.outputs[1] if has_probs else ctx.op(OpCode.SOFTMAX, [logits], axis=-1)
    smoothing = float(node.attrs.get("label_smoothing", 0.0))
    dx = None
    if grads[0] is not None:
        dx = ctx.op(
            OpCode.SOFTMAX_CROSS_ENTROPY_GRAD, [grads[0], probs, labels], label_smoothing=smoothing
        )
    if len(grads) > 1 and grads[1] is not None:
        # The probabilities output is softmax(logits) (a second derivative reaches it
        # through the first one's backward node).
        dp = ctx.op(OpCode.SOFTMAX_GRAD, [grads[1], probs], axis=-1)
        dx = dp if dx is None else ctx.op(OpCode.ADD, [dx, dp])
    return [dx, None]


def mse_loss(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    pred, target = node.inputs
    dpred = ctx.op(OpCode.MSE_LOSS_GRAD, [grads[0], pred, target])
    dtarget = ctx.op(OpCode.NEG, [dpred]) if ctx.needs(target) else None
    return [dpred if ctx.needs(pred) else None, dtarget]


def bce_with_logits(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    _no_label_gradient(ctx, node)
    x, t = node.inputs
    return [ctx.op(OpCode.BCE_WITH_LOGITS_GRAD, [grads[0], x, t]), None]
