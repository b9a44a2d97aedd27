"""Gradients of data-movement ops (kernels: lite/kernels/transform.py, pad.py, reduce.py).

Arguments that the forward op may take as constant inputs (Slice's starts/ends, Pad's
pads, Reduce's axes) are read here and passed to the backward op as attributes.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.reshape import reshape_back
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def _ints(ctx: GradContext, node: Node, index: int, name: str) -> list[int] | None:
    """An int-list argument from constant input `index` or attribute `name` (None if neither)."""
    if index < len(node.inputs) and node.inputs[index] != -1:
        value = ctx.value(node.inputs[index])
        if value is None:
            raise UnsupportedOpError(
                f"{node.op.name} {node.name!r}: no gradient when {name} is computed at run time"
            )
        return [int(v) for v in np.ravel(value)]
    value = node.attrs.get(name)
    return None if value is None else [int(v) for v in value]


def _none_for_arguments(node: Node, dx: int | None) -> list[int | None]:
    return [dx] + [None] * (len(node.inputs) - 1)


def transpose(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    perm = node.attrs.get("perm")
    perm = list(perm) if perm is not None else list(range(ctx.rank(node.inputs[0])))[::-1]
    return [ctx.op(OpCode.TRANSPOSE, [grads[0]], perm=[int(p) for p in np.argsort(perm)])]


def squeeze(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Squeeze and Unsqueeze only change the shape.
    dx = reshape_back(ctx, grads[0], node.inputs[0], f"{node.op.name} {node.name!r}")
    return _none_for_arguments(node, dx)


def concat(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    rank = ctx.rank(node.outputs[0])
    axis = int(node.attrs["axis"]) % rank
    if len(node.inputs) == 1:
        return [grads[0]]
    sizes = [ctx.shape(i)[axis] for i in node.inputs]
    if -1 in sizes:
        raise UnsupportedOpError(f"CONCAT {node.name!r}: no gradient along a dynamic axis")
    parts = ctx.op_multi(OpCode.SPLIT, [grads[0]], len(sizes), axis=axis, split=sizes)
    return [p if ctx.needs(i) else None for p, i in zip(parts, node.inputs, strict=True)]


def split(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    axis = int(node.attrs.get("axis", 0))
    # Outputs the loss does not use contribute zeros.
    parts = [
        g if g is not None else ctx.op(OpCode.MUL, [o, ctx.scalar(0.0, o)])
        for g, o in zip(grads, node.outputs, strict=True)
    ]
    dx = parts[0] if len(parts) == 1 else ctx.op(OpCode.CONCAT, parts, axis=axis)
    return _none_for_arguments(node, dx)


def slice_(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    attrs = {}
    for k, name in enumerate(("starts", "ends", "axes", "steps"), start=1):
        value = _ints(ctx, node, k, name)
        if value is not None:
            attrs[name] = value
    dx = ctx.op(OpCode.SLICE_GRAD, [grads[0], node.inputs[0]], **attrs)
    return _none_for_arguments(node, dx)


def pad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    attrs: dict = {"mode": node.attrs.get("mode", "constant")}
    pads = _ints(ctx, node, 1, "pads")
    axes = _ints(ctx, node, 3, "axes")
    attrs["pads"] = pads
    if axes is not None:
        attrs["axes"] = axes
    dx = ctx.op(OpCode.PAD_GRAD, [grads[0], node.inputs[0]], **attrs)
    return _none_for_arguments(node, dx)


def gather(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    data, indices = node.inputs
    axis = int(node.attrs.get("axis", 0))
    return [ctx.op(OpCode.GATHER_GRAD, [grads[0], indices, data], axis=axis), None]


def expand(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    dx = ctx.sum_to(grads[0], node.inputs[0], node.outputs[0])
    return _none_for_arguments(node, dx)


def _reduce(reduction: str):
    def rule(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
        axes = _ints(ctx, node, 1, "axes") or []
        if not axes and node.attrs.get("noop_with_empty_axes", 0):
            return _none_for_arguments(node, grads[0])
        dx = ctx.op(
            OpCode.REDUCE_GRAD,
            [grads[0], node.inputs[0]],
            axes=axes,
            keepdims=int(node.attrs.get("keepdims", 1)),
            reduction=reduction,
        )
        return _none_for_arguments(node, dx)

    rule.__name__ = f"reduce_{reduction}"
    return rule


reduce_sum = _reduce("sum")
reduce_mean = _reduce("mean")


def where(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # y = a where c else b: the gradient goes to the input picked, summed over broadcasting.
    c, a, b = node.inputs
    y = node.outputs[0]
    (g,) = grads
    if g is None:
        return [None, None, None]
    zero = ctx.scalar(0.0, y)
    da = ctx.sum_to(ctx.op(OpCode.WHERE, [c, g, zero]), a, y) if ctx.needs(a) else None
    db = ctx.sum_to(ctx.op(OpCode.WHERE, [c, zero, g]), b, y) if ctx.needs(b) else None
    return [None, da, db]
