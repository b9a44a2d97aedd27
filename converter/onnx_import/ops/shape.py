"""Shape and layout ops: Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Split,
Slice, Gather, Expand, Tile, Cast, Pad, DepthToSpace/SpaceToDepth.

Static shape arguments (initializers or folded constant chains) become attributes, so the
IR carries the ONNX semantics without extra tensors.
"""

from __future__ import annotations

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode, as_ints
from sporenet.lite.ops import OpCode


def _static_ints(ctx: ImportContext, node: OnnxNode, k: int, what: str) -> list[int] | None:
    index = node.input(k)
    if index == -1:
        return None
    value = as_ints(ctx.value(index))
    if value is None:
        raise node.fail(f"{what} (input {k}) must be static (known at conversion time)")
    return value


def reshape(ctx: ImportContext, node: OnnxNode) -> list[int]:
    target = _static_ints(ctx, node, 1, "the target shape")
    if target is None:
        raise node.fail("needs a target shape input")
    allowzero = int(node.attr("allowzero", 0))
    return [ctx.emit1(OpCode.RESHAPE, [node.input(0)], shape=target,
                      allowzero=allowzero or None)]


def flatten(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    axis = int(node.attr("axis", 1))
    if axis < 0:
        axis += ctx.rank(x)
    return [ctx.emit1(OpCode.FLATTEN, [x], axis=axis)]
