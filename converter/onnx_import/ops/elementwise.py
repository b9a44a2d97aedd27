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
        a, b = node.input(0), node.input(1)
        if op == OpCode.POW and ctx.dtype(a) != ctx.dtype(b):
            # Pow-12 allows an exponent of another type; the runtime wants one dtype.
            value = ctx.value(b)
            if value is None:
                raise node.fail(f"exponent dtype {ctx.dtype(b)} differs from base dtype "
                                f"{ctx.dtype(a)} and is not a constant")
            b = ctx.constant(f"{node.name}/exponent", value.astype(ctx.dtype(a)))
        return [ctx.emit1(op, [a, b])]

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
    return [ctx.emit1(OpCode.PRELU, [node.input(0), node.input(1)])]


def where(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [ctx.emit1(OpCode.WHERE, [node.input(0), node.input(1), node.input(2)])]
