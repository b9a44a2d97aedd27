"""Shape and layout ops: Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Split,
Slice, Gather, Expand, Tile, Cast, Pad, DepthToSpace/SpaceToDepth.

Static shape arguments (initializers or folded constant chains) become attributes, so the
IR carries the ONNX semantics without extra tensors; one computed from a dynamic input
dimension stays a tensor input, evaluated by the runtime when it plans the graph.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode, as_ints
from sporenet.lite import lowp
from sporenet.lite.ops import OpCode


def _static_ints(ctx: ImportContext, node: OnnxNode, k: int, what: str) -> list[int] | None:
    return as_ints(ctx.static_input(node, k, what))


def shape_arg(ctx: ImportContext, node: OnnxNode, k: int) -> tuple[list[int] | None, int]:
    """Input k of a shape-like argument (a target shape, sizes, repeats, axes): its ints when
    known at conversion time (they become an attribute), else the tensor itself, kept as a
    node input that the runtime evaluates when it plans the graph for concrete input shapes
    (a Shape -> Gather -> Concat chain on a dynamic dimension). (None, -1) when absent."""
    index = node.input(k)
    if index == -1:
        return None, -1
    value = ctx.value(index)
    if value is not None:
        return as_ints(value), -1
    return None, index


def _dynamic_target(
    ctx: ImportContext,
    node: OnnxNode,
    x: int,
    allowzero: int,
) -> list[int] | None:
    """A target shape computed from the input's dynamic dimensions (exporters write
    Shape -> Gather -> Concat -> Reshape), as a static target when it is one under every
    probe: an entry that follows an input dimension becomes 0 (copy it), one other unknown
    entry becomes -1."""
    values = ctx.view_values(node.input(1))
    if values is None:
        return None
    first, second = ([int(v) for v in np.ravel(t)] for t in values)
    in_first, in_second = (view[x].shape for view in ctx.views)
    target: list[int | None] = []
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        if a == b:
            target.append(a)
        elif not allowzero and i < len(in_first) and in_first[i] == a and in_second[i] == b:
            target.append(0)
        else:
            target.append(None)
    if target.count(None) == 1 and -1 not in target:
        target[target.index(None)] = -1
    if None in target:
        return None
    return target  # type: ignore[return-value]


def reshape(ctx: ImportContext, node: OnnxNode) -> list[int]:
    allowzero = int(node.attr("allowzero", 0))
    target, tensor = shape_arg(ctx, node, 1)
    if tensor != -1:
        static = _dynamic_target(ctx, node, node.input(0), allowzero)
        if static is not None:
            target, tensor = static, -1
    if target is None and tensor == -1:
        raise node.fail("needs a target shape input")
    inputs = [node.input(0)] if tensor == -1 else [node.input(0), tensor]
    return [ctx.emit1(OpCode.RESHAPE, inputs, shape=target, allowzero=allowzero or None)]


def flatten(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    axis = int(node.attr("axis", 1))
    if axis < 0:
        axis += ctx.rank(x)
    return [ctx.emit1(OpCode.FLATTEN, [x], axis=axis)]


def _axes(ctx: ImportContext, node: OnnxNode, attr_until: int) -> tuple[list[int] | None, int]:
    """`axes` as an attribute before opset `attr_until`, as input 1 from then on."""
    if node.opset < attr_until:
        return node.ints("axes"), -1
    return shape_arg(ctx, node, 1)


def _with_arg(x: int, tensor: int) -> list[int]:
    return [x] if tensor == -1 else [x, tensor]


def transpose(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    perm = node.ints("perm") or list(range(ctx.rank(x)))[::-1]
    return [ctx.emit1(OpCode.TRANSPOSE, [x], perm=perm)]


def squeeze(ctx: ImportContext, node: OnnxNode) -> list[int]:
    axes, tensor = _axes(ctx, node, 13)
    return [ctx.emit1(OpCode.SQUEEZE, _with_arg(node.input(0), tensor), axes=axes)]


def unsqueeze(ctx: ImportContext, node: OnnxNode) -> list[int]:
    axes, tensor = _axes(ctx, node, 13)
    if axes is None and tensor == -1:
        raise node.fail("needs axes")
    return [ctx.emit1(OpCode.UNSQUEEZE, _with_arg(node.input(0), tensor), axes=axes)]


def concat(ctx: ImportContext, node: OnnxNode) -> list[int]:
    inputs = [i for i in node.inputs if i != -1]
    return [ctx.emit1(OpCode.CONCAT, inputs, axis=int(node.attr("axis")))]


def split(ctx: ImportContext, node: OnnxNode) -> list[int]:
    sizes, tensor = (node.ints("split"), -1) if node.opset < 13 else shape_arg(ctx, node, 1)
    # The node's output count tells the kernel how many parts (num_outputs, opset 18,
    # must agree with it, which the ONNX checker already ensures).
    return ctx.emit(
        OpCode.SPLIT,
        _with_arg(node.input(0), tensor),
        num_outputs=len(node.outputs),
        axis=int(node.attr("axis", 0)),
        split=sizes,
    )


def slice_(ctx: ImportContext, node: OnnxNode) -> list[int]:
    if node.opset < 10:
        attrs = {name: node.ints(name) for name in ("starts", "ends", "axes")}
        return [ctx.emit1(OpCode.SLICE, [node.input(0)], **attrs)]
    names = ("starts", "ends", "axes", "steps")
    args = [shape_arg(ctx, node, k) for k in range(1, 5)]
    attrs = {name: ints for name, (ints, _) in zip(names, args, strict=True)}
    tensors = [tensor for _, tensor in args]
    while tensors and tensors[-1] == -1:
        tensors.pop()
    return [ctx.emit1(OpCode.SLICE, [node.input(0), *tensors], **attrs)]


def gather(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [
        ctx.emit1(OpCode.GATHER, [node.input(0), node.input(1)], axis=int(node.attr("axis", 0)))
    ]


def expand(ctx: ImportContext, node: OnnxNode) -> list[int]:
    target, tensor = shape_arg(ctx, node, 1)
    return [ctx.emit1(OpCode.EXPAND, _with_arg(node.input(0), tensor), shape=target)]


def tile(ctx: ImportContext, node: OnnxNode) -> list[int]:
    repeats, tensor = shape_arg(ctx, node, 1)
    return [ctx.emit1(OpCode.TILE, _with_arg(node.input(0), tensor), repeats=repeats)]


def _cast_options(node: OnnxNode) -> dict[str, int | str]:
    """Cast's float8 options (opset 19, 24), passed only when the node sets them."""
    options: dict[str, int | str] = {}
    if node.attr("saturate", None) is not None:
        options["saturate"] = int(node.attr("saturate"))
    if node.attr("round_mode", None) is not None:
        mode = node.attr("round_mode")
        options["round_mode"] = mode.decode() if isinstance(mode, bytes) else str(mode)
    return options


def cast(ctx: ImportContext, node: OnnxNode) -> list[int]:
    to = int(node.attr("to"))
    return [ctx.emit1(OpCode.CAST, [node.input(0)], to=to, **_cast_options(node))]


def cast_like(ctx: ImportContext, node: OnnxNode) -> list[int]:
    target = ctx.dtype(node.input(1))
    kind = lowp.lowp_type(target)
    to = kind.name if kind is not None else str(target)
    return [ctx.emit1(OpCode.CAST, [node.input(0)], to=to, **_cast_options(node))]


def pad(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Pads as attributes before opset 11; as inputs (pads, constant_value, axes) after."""
    x = node.input(0)
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        return [
            ctx.emit1(
                OpCode.PAD,
                [x],
                mode=mode,
                pads=node.ints("pads"),
                value=float(node.attr("value", 0.0)),
            )
        ]
    # pads and axes fed at run time stay the node's inputs (planned with their values)
    pads, pads_tensor = shape_arg(ctx, node, 1)
    axes, axes_tensor = shape_arg(ctx, node, 3)
    value = node.input(2)
    if value != -1 and ctx.value(value) is None and value not in ctx.fed:
        raise node.fail("constant_value (input 2) must be static")
    inputs = [x, pads_tensor, value, axes_tensor]
    while inputs[-1] == -1:
        inputs.pop()
    return [ctx.emit1(OpCode.PAD, inputs, mode=mode, pads=pads, axes=axes)]


def depth_to_space(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [
        ctx.emit1(
            OpCode.DEPTH_TO_SPACE,
            [node.input(0)],
            blocksize=int(node.attr("blocksize")),
            mode=node.attr("mode", "DCR"),
        )
    ]


def space_to_depth(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """DCR (the default) maps onto the runtime op; CRD (opset 25) is a Reshape, Transpose,
    Reshape sequence."""
    x, b = node.input(0), int(node.attr("blocksize"))
    mode = node.attr("mode", "DCR")
    if mode == "DCR":
        return [ctx.emit1(OpCode.SPACE_TO_DEPTH, [x], blocksize=b)]
    if mode != "CRD":
        raise node.fail(f"mode must be 'DCR' or 'CRD', got {mode!r}")
    n, c, h, w = ctx.spec(x).shape
    six = ctx.emit1(OpCode.RESHAPE, [x], shape=[n, c, h // b, b, w // b, b])
    moved = ctx.emit1(OpCode.TRANSPOSE, [six], perm=[0, 1, 3, 5, 2, 4])
    return [ctx.emit1(OpCode.RESHAPE, [moved], shape=[n, c * b * b, h // b, w // b])]


def range_(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Range with static start, limit and delta folds to a constant; otherwise (a limit
    computed from a dynamic dimension) it is a RANGE node the runtime evaluates when it
    plans the graph."""
    values = [ctx.value(node.input(k)) for k in range(3)]
    known = [v for v in values if v is not None]
    if len(known) < 3:
        return [ctx.emit1(OpCode.RANGE, [node.input(k) for k in range(3)])]
    start, limit, delta = (v.reshape(()) for v in known)
    if delta == 0:
        raise node.fail("delta must not be 0")
    count = max(int(np.ceil((limit - start) / delta)), 0)
    out = (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)
    return [ctx.constant(node.outputs[0], out)]
