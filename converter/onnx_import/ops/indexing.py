"""Index-driven ops: GatherND, GatherElements, ScatterND and ScatterElements (and the
deprecated Scatter, ScatterElements under its opset 9 name), each onto one IR op that
takes ONNX's semantics as attributes: batch axes, negative indices counted from the end,
and the scatters' reductions."""

from __future__ import annotations

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode


def _reduction(node: OnnxNode) -> str:
    value = node.attr("reduction", "none")
    return value.decode() if isinstance(value, bytes) else str(value)


def gather_nd(ctx: ImportContext, node: OnnxNode) -> list[int]:
    batch_dims = int(node.attr("batch_dims", 0))
    return [
        ctx.emit1(OpCode.GATHER_ND, [node.input(0), node.input(1)], batch_dims=batch_dims, wrap=1)
    ]


def gather_elements(ctx: ImportContext, node: OnnxNode) -> list[int]:
    axis = int(node.attr("axis", 0))
    return [ctx.emit1(OpCode.GATHER_ELEMENTS, [node.input(0), node.input(1)], axis=axis)]


def scatter_nd(ctx: ImportContext, node: OnnxNode) -> list[int]:
    inputs = [node.input(0), node.input(1), node.input(2)]
    return [ctx.emit1(OpCode.SCATTER_ND_UPDATE, inputs, reduction=_reduction(node))]


def scatter_elements(ctx: ImportContext, node: OnnxNode) -> list[int]:
    inputs = [node.input(0), node.input(1), node.input(2)]
    axis = int(node.attr("axis", 0))
    return [ctx.emit1(OpCode.SCATTER_ELEMENTS, inputs, axis=axis, reduction=_reduction(node))]
