"""Reductions: ReduceMean/Sum/Max/Min/Prod onto the runtime ops, the others composed
(L1 = Sum|x|, L2 = sqrt(Sum x²), SumSquare, LogSum, LogSumExp), and ArgMax/ArgMin."""

from __future__ import annotations

from collections.abc import Callable

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops.shape import shape_arg
from sporenet.lite.ops import OpCode

Handler = Callable[[ImportContext, OnnxNode], list[int]]

# The opset from which each reduction takes `axes` as an input instead of an attribute.
AXES_INPUT_FROM = {"ReduceSum": 13}


def _reduce(ctx: ImportContext, node: OnnxNode, op: OpCode, x: int) -> int:
    tensor = -1
    if node.opset >= AXES_INPUT_FROM.get(node.op_type, 18):
        # axes fed at run time stay the node's input (the runtime plans with their value)
        axes, tensor = shape_arg(ctx, node, 1)
    else:
        axes = node.ints("axes")
    attrs: dict[str, int | list[int] | None] = {
        "keepdims": int(node.attr("keepdims", 1)),
        "noop_with_empty_axes": int(node.attr("noop_with_empty_axes", 0)) or None,
    }
    if axes:
        attrs["axes"] = axes
    return ctx.emit1(op, [x] if tensor == -1 else [x, tensor], **attrs)


def reduce(
    op: OpCode,
    *,
    before: tuple[OpCode, ...] = (),
    after: tuple[OpCode, ...] = (),
    square: bool = False,
) -> Handler:
    """Reduce with `op`, after applying `before` (elementwise) and then `after`."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        x = node.input(0)
        if square:
            x = ctx.emit1(OpCode.MUL, [x, x])
        for pre in before:
            x = ctx.emit1(pre, [x])
        y = _reduce(ctx, node, op, x)
        for post in after:
            y = ctx.emit1(post, [y])
        return [y]

    return convert


def arg(op: OpCode) -> Handler:
    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        return [
            ctx.emit1(
                op,
                [node.input(0)],
                axis=int(node.attr("axis", 0)),
                keepdims=int(node.attr("keepdims", 1)),
                select_last_index=int(node.attr("select_last_index", 0)),
            )
        ]

    return convert
