"""Conv, MaxPool, AveragePool and the global pools (NCHW, ONNX attribute semantics).

The runtime's Conv2D and pools are 2-D; 1-D ops run as 2-D ones over a height of 1
(Unsqueeze before, Squeeze after), with every attribute extended accordingly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode


def _spatial_attrs(node: OnnxNode, spatial: int, names: tuple[str, ...]) -> dict[str, Any]:
    """ONNX window attributes, extended from 1-D to 2-D when `spatial` is 1."""
    attrs: dict[str, Any] = {}
    for name in names:
        if name not in node.attrs:
            continue
        value = node.attr(name)
        if spatial == 1 and name in ("kernel_shape", "strides", "dilations"):
            value = [1, *value]
        elif spatial == 1 and name == "pads":
            value = [0, value[0], 0, value[1]]
        attrs[name] = value
    return attrs


def _to_2d(ctx: ImportContext, node: OnnxNode, x: int) -> tuple[int, int]:
    """(input as a 4-D tensor, number of spatial axes of the original)."""
    rank = ctx.rank(x)
    if rank == 4:
        return x, 2
    if rank == 3:
        return ctx.emit1(OpCode.UNSQUEEZE, [x], axes=[2]), 1
    raise node.fail(f"only 1-D and 2-D {node.op_type} is supported; the input has rank {rank} "
                    f"(shape {list(ctx.shape(x))})")


def _from_2d(ctx: ImportContext, y: int, spatial: int) -> int:
    return y if spatial == 2 else ctx.emit1(OpCode.SQUEEZE, [y], axes=[2])


WINDOW = ("kernel_shape", "strides", "dilations", "pads", "auto_pad")


def conv(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x, w, b = node.input(0), node.input(1), node.input(2)
    x4, spatial = _to_2d(ctx, node, x)
    if spatial == 1:
        value = ctx.value(w)
        if value is not None:
            w = ctx.constant(f"{ctx.tensors[w].name}/2d", value[:, :, None, :])
        else:
            w = ctx.emit1(OpCode.UNSQUEEZE, [w], axes=[2])
    attrs = _spatial_attrs(node, spatial, WINDOW)
    attrs["group"] = int(node.attr("group", 1))
    inputs = [x4, w] if b == -1 else [x4, w, b]
    return [_from_2d(ctx, ctx.emit1(OpCode.CONV2D, inputs, **attrs), spatial)]


def max_pool(ctx: ImportContext, node: OnnxNode) -> list[int]:
    node.only_first_output()
    if int(node.attr("storage_order", 0)) not in (0, 1):
        raise node.fail("storage_order must be 0 or 1")
    x4, spatial = _to_2d(ctx, node, node.input(0))
    attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode"))
    return [_from_2d(ctx, ctx.emit1(OpCode.MAX_POOL2D, [x4], **attrs), spatial)]


def average_pool(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x4, spatial = _to_2d(ctx, node, node.input(0))
    attrs = _spatial_attrs(node, spatial, (*WINDOW, "ceil_mode", "count_include_pad"))
    return [_from_2d(ctx, ctx.emit1(OpCode.AVG_POOL2D, [x4], **attrs), spatial)]


def global_pool(op: OpCode):  # type: ignore[no-untyped-def]
    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        return [ctx.emit1(op, [node.input(0)])]

    return convert


def conv_transpose(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x, w, b = node.input(0), node.input(1), node.input(2)
    x4, spatial = _to_2d(ctx, node, x)
    if spatial == 1:
        value = ctx.value(w)
        if value is None:
            raise node.fail("1-D ConvTranspose needs constant weights")
        w = ctx.constant(f"{ctx.tensors[w].name}/2d", np.ascontiguousarray(value[:, :, None, :]))
    attrs = _spatial_attrs(node, spatial, WINDOW)
    for name in ("output_padding", "output_shape"):
        if name in node.attrs:
            ints = node.ints(name) or []
            attrs[name] = ints if spatial == 2 else [0 if name == "output_padding" else 1, *ints]
    attrs["group"] = int(node.attr("group", 1))
    inputs = [x4, w] if b == -1 else [x4, w, b]
    return [_from_2d(ctx, ctx.emit1(OpCode.CONV_TRANSPOSE2D, inputs, **attrs), spatial)]
