"""Gradient of FAKE_QUANT (kernel: lite/kernels/fake_quant.py): the straight-through
estimator, one FAKE_QUANT_GRAD node giving dx and, for learned ranges, dmin and dmax."""

from __future__ import annotations

from sporenet.lite.autodiff.engine import GradContext
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def fake_quant(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    ranges = [i for i in node.inputs[1:3] if i != -1]
    if grads[0] is None:
        return [None] * len(node.inputs)
    if not ranges:  # symmetric weights: the range is x's own, nothing is clamped
        return [grads[0]] + [None] * (len(node.inputs) - 1)
    attrs = {
        k: v
        for k, v in node.attrs.items()
        if k in ("num_bits", "narrow_range", "axis", "per_channel")
    }
    outs = ctx.op_multi(
        OpCode.FAKE_QUANT_GRAD, [grads[0], *node.inputs[:1], *ranges], 1 + len(ranges), **attrs
    )
    result: list[int | None] = [outs[0]]
    result += [outs[k] if ctx.needs(i) else None for k, i in enumerate(ranges, start=1)]
    return result + [None] * (len(node.inputs) - len(result))
