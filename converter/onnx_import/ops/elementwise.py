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


def mod(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Mod: with fmod=1 the remainder has the dividend's sign (C fmod), with fmod=0 the
    divisor's (Python %). Static operands fold with NumPy; otherwise the runtime computes
    r = a - trunc(a / b) * b, then for fmod=0 adds b where r and b differ in sign."""
    a, b = node.input(0), node.input(1)
    fmod = int(node.attr("fmod", 0))
    va, vb = ctx.value(a), ctx.value(b)
    if va is not None and vb is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.fmod(va, vb) if fmod else np.mod(va, vb)
        return [ctx.constant(node.outputs[0], value.astype(va.dtype))]
    q = ctx.emit1(OpCode.DIV, [a, b])  # integer Div truncates toward zero
    if ctx.dtype(a).kind == "f":
        zero_f = ctx.constant(f"{node.name}/zero_q", np.array(0, ctx.dtype(a)))
        negative = ctx.emit1(OpCode.LESS, [q, zero_f])
        q = ctx.emit1(
            OpCode.WHERE, [negative, ctx.emit1(OpCode.CEIL, [q]), ctx.emit1(OpCode.FLOOR, [q])]
        )
    zero = ctx.constant(f"{node.name}/zero", np.array(0, ctx.dtype(a)))
    product = ctx.emit1(OpCode.MUL, [q, b])
    if ctx.dtype(a).kind == "f":
        # q = 0 with an infinite divisor: the product is 0 (not 0 * inf = nan).
        product = ctx.emit1(OpCode.WHERE, [ctx.emit1(OpCode.EQUAL, [q, zero]), zero, product])
    r = ctx.emit1(OpCode.SUB, [a, product])
    if fmod:
        return [r]
    nonzero = _not(ctx, node, ctx.emit1(OpCode.EQUAL, [r, zero]))
    sign_differs = _not(
        ctx,
        node,
        ctx.emit1(
            OpCode.EQUAL, [ctx.emit1(OpCode.LESS, [r, zero]), ctx.emit1(OpCode.LESS, [b, zero])]
        ),
    )
    fix = ctx.emit1(OpCode.MUL, [nonzero, sign_differs])
    return [ctx.emit1(OpCode.WHERE, [fix, ctx.emit1(OpCode.ADD, [r, b]), r])]
