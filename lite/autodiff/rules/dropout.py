"""Gradient of Dropout (kernel: lite/kernels/training/dropout.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def dropout(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Training mode: y = x * mask (output 1, already scaled by 1 / (1 - ratio)); else y = x.
    training = bool(node.attrs.get("training", 0)) and float(node.attrs.get("ratio", 0.5)) > 0
    # Input 1, when present, is the random step counter: no gradient.
    if not training:
        return [grads[0], None][: len(node.inputs)]
    if len(node.outputs) < 2:
        raise UnsupportedOpError(
            f"DROPOUT {node.name!r}: training mode needs the mask as output 1 to differentiate"
        )
    return [ctx.op(OpCode.MUL, [grads[0], node.outputs[1]]), None][: len(node.inputs)]
