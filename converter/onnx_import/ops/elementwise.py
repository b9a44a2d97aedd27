"""Binary elementwise ops with broadcasting, and variadic Sum/Mean/Max/Min."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode

Handler = Callable[[ImportContext, OnnxNode], list[int]]


def binary(op: OpCode) -> Handler:
    """A handler mapping a two-input ONNX op onto one IR op."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        return [ctx.emit1(op, [node.input(0), node.input(1)])]

    return convert


def variadic(op: OpCode, *, mean: bool = False) -> Handler:
    """Sum/Max/Min/Mean of N inputs: a chain of binary ops (Mean divides by N at the end)."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        inputs = [i for i in node.inputs if i != -1]
        if not inputs:
            raise node.fail("needs at least one input")
        acc = inputs[0]
        for other in inputs[1:]:
            acc = ctx.emit1(op, [acc, other])
        if mean and len(inputs) > 1:
            count = ctx.constant(f"{node.name}/count", np.array(len(inputs), ctx.dtype(acc)))
            acc = ctx.emit1(OpCode.DIV, [acc, count])
        if acc == inputs[0] and len(inputs) == 1:
            return [acc]
        return [acc]

    return convert


def prelu(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """A 1-D slope of C values that does not broadcast NumPy-style is per channel (axis 1),
    as in opset 6 (which ONNX's version converter leaves unchanged)."""
    x, slope = node.input(0), node.input(1)
    value = ctx.value(slope)
    x_shape = ctx.spec(x).shape
    if value is not None and value.ndim == 1 and len(x_shape) >= 3 and value.size == x_shape[1]:
        try:
            np.broadcast_shapes(x_shape, value.shape)
        except ValueError:
            per_channel = value.reshape((-1,) + (1,) * (len(x_shape) - 2))
            slope = ctx.constant(f"{ctx.tensors[slope].name}/per_channel", per_channel)
    return [ctx.emit1(OpCode.PRELU, [x, slope])]


def where(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [ctx.emit1(OpCode.WHERE, [node.input(0), node.input(1), node.input(2)])]


def _not(ctx: ImportContext, node: OnnxNode, x: int) -> int:
    """Logical not as x == False (the runtime has no Not op)."""
    false = ctx.constant(f"{node.name}/false", np.array(False))
    return ctx.emit1(OpCode.EQUAL, [x, false])


def logical_not(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [_not(ctx, node, node.input(0))]


def negated(op: OpCode, *, swap: bool = False) -> Handler:
    """GreaterOrEqual = not Less, LessOrEqual = not Greater."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        a, b = node.input(0), node.input(1)
        return [_not(ctx, node, ctx.emit1(op, [b, a] if swap else [a, b]))]

    return convert


def logical(kind: str) -> Handler:
    """And = Mul, Or = Maximum on bools; Xor = not (a == b)."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        a, b = node.input(0), node.input(1)
        if kind == "and":
            return [ctx.emit1(OpCode.MUL, [a, b])]
        if kind == "or":
            return [ctx.emit1(OpCode.MAXIMUM, [a, b])]
        return [_not(ctx, node, ctx.emit1(OpCode.EQUAL, [a, b]))]

    return convert
