"""Unary ops and activations: Relu, Sigmoid, LeakyRelu, Clip, Gelu, Exp, ..."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode

Handler = Callable[[ImportContext, OnnxNode], list[int]]


def unary(op: OpCode, **defaults: float) -> Handler:
    """A handler mapping a one-input ONNX op onto one IR op; `defaults` are ONNX attribute
    defaults, always written out so the IR does not depend on defaults of its own."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        attrs = {name: float(node.attr(name, value)) for name, value in defaults.items()}
        return [ctx.emit1(op, [node.input(0)], **attrs)]

    return convert


def gelu(ctx: ImportContext, node: OnnxNode) -> list[int]:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.fail(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return [ctx.emit1(OpCode.GELU, [node.input(0)], approximate=approximate)]


def selu(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Selu(x) = gamma * Elu(x, alpha)."""
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))
    x = node.input(0)
    elu = ctx.emit1(OpCode.ELU, [x], alpha=alpha)
    scale = ctx.constant(f"{node.name}/gamma", np.array(gamma, ctx.dtype(x)))
    return [ctx.emit1(OpCode.MUL, [elu, scale])]


def softsign(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Softsign(x) = x / (1 + |x|)."""
    x = node.input(0)
    one = ctx.constant(f"{node.name}/one", np.array(1, ctx.dtype(x)))
    denominator = ctx.emit1(OpCode.ADD, [ctx.emit1(OpCode.ABS, [x]), one])
    return [ctx.emit1(OpCode.DIV, [x, denominator])]


def clip(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Clip bounds come from attributes before opset 11 and from optional inputs after.

    Static bounds become `min`/`max` attributes; bounds known only at run time become
    Maximum/Minimum nodes with the bound tensors.
    """
    x = node.input(0)
    if node.opset < 11:
        lo, hi = node.attr("min", None), node.attr("max", None)
        attrs = {"min": lo, "max": hi}
    else:
        lo_index, hi_index = node.input(1), node.input(2)
        static = all(i == -1 or ctx.value(i) is not None for i in (lo_index, hi_index))
        if not static:
            out = x
            if lo_index != -1:
                out = ctx.emit1(OpCode.MAXIMUM, [out, lo_index])
            if hi_index != -1:
                out = ctx.emit1(OpCode.MINIMUM, [out, hi_index])
            return [out]
        attrs = {}
        for name, i in (("min", lo_index), ("max", hi_index)):
            bound = ctx.value(i)
            attrs[name] = None if bound is None else np.ravel(bound)[0].item()
    attrs = {k: v for k, v in attrs.items() if v is not None}
    if not attrs:
        return [x]
    return [ctx.emit1(OpCode.CLIP, [x], **attrs)]


def mish(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Mish(x) = x * tanh(softplus(x))."""
    x = node.input(0)
    t = ctx.emit1(OpCode.TANH, [ctx.emit1(OpCode.SOFTPLUS, [x])])
    return [ctx.emit1(OpCode.MUL, [x, t])]


def thresholded_relu(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x where x > alpha, else 0."""
    x = node.input(0)
    dtype = ctx.dtype(x)
    alpha = ctx.constant(f"{node.name}/alpha", np.array(node.attr("alpha", 1.0), dtype))
    zero = ctx.constant(f"{node.name}/zero", np.array(0, dtype))
    return [ctx.emit1(OpCode.WHERE, [ctx.emit1(OpCode.GREATER, [x, alpha]), x, zero])]


def celu(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Celu(x) = alpha * Elu(x / alpha, 1)."""
    x = node.input(0)
    alpha = float(node.attr("alpha", 1.0))
    a = ctx.constant(f"{node.name}/alpha", np.array(alpha, ctx.dtype(x)))
    elu = ctx.emit1(OpCode.ELU, [ctx.emit1(OpCode.DIV, [x, a])], alpha=1.0)
    return [ctx.emit1(OpCode.MUL, [elu, a])]
