"""Resize (opsets 10, 11+, 18+) and Upsample (opsets 7, 9): the runtime's Resize op.

Static scales or sizes become attributes. Upsample and Resize-10 predate the coordinate
modes: they sample asymmetrically (x_in = x_out / scale) and nearest rounds down.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode

MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear"}


def _mode(node: OnnxNode) -> str:
    mode = node.attr("mode", "nearest")
    if mode not in MODES:
        raise node.fail(f"mode {mode!r} is not supported (the runtime has nearest and linear)")
    return MODES[mode]


def _static_floats(ctx: ImportContext, node: OnnxNode, k: int, what: str) -> list[float] | None:
    value = ctx.static_input(node, k, what)
    return None if value is None else [float(v) for v in np.ravel(value)] or None


def upsample(ctx: ImportContext, node: OnnxNode) -> list[int]:
    scales = node.attr("scales") if node.opset < 9 else _static_floats(ctx, node, 1, "scales")
    if not scales:
        raise node.fail("needs scales")
    return [
        ctx.emit1(
            OpCode.RESIZE,
            [node.input(0)],
            mode=_mode(node),
            scales=[float(s) for s in scales],
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
        )
    ]


def resize(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    mode = _mode(node)
    if node.opset < 11:
        scales = _static_floats(ctx, node, 1, "scales")
        return [
            ctx.emit1(
                OpCode.RESIZE,
                [x],
                mode=mode,
                scales=scales,
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
            )
        ]
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": node.attr("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
    }
    for name in ("antialias", "exclude_outside"):
        if int(node.attr(name, 0)):
            raise node.fail(f"{name}=1 is not supported")
    if node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise node.fail("only keep_aspect_ratio_policy='stretch' is supported")
    axes = node.ints("axes")
    dynamic = [k for k in (2, 3) if node.input(k) != -1 and ctx.value(node.input(k)) is None]
    if dynamic and axes is None:
        # Sizes or scales computed from a dynamic input dimension: kept as the node's input,
        # evaluated by the runtime when it plans the graph.
        k = dynamic[0]
        inputs = [x, -1, -1, -1][: k + 1]
        inputs[k] = node.input(k)
        return [ctx.emit1(OpCode.RESIZE, inputs, **attrs)]
    scales = _static_floats(ctx, node, 2, "scales")
    sizes_index = node.input(3)
    sizes = None
    if sizes_index != -1:
        value = ctx.value(sizes_index)
        if value is None:
            raise node.fail("sizes (input 3) must be static (known at conversion time)")
        sizes = [int(v) for v in np.ravel(value)] or None
    rank = ctx.rank(x)
    if axes is not None:
        # Spread per-axis values over all axes (1 / the input size for the others).
        full_scales = [1.0] * rank
        full_sizes = list(ctx.spec(x).shape)
        for k, a in enumerate(axes):
            a = a + rank if a < 0 else a
            if scales is not None:
                full_scales[a] = scales[k]
            if sizes is not None:
                full_sizes[a] = sizes[k]
        scales = full_scales if scales is not None else None
        sizes = full_sizes if sizes is not None else None
    if sizes is not None:
        attrs["sizes"] = sizes
    elif scales is not None:
        attrs["scales"] = scales
    else:
        raise node.fail("needs scales or sizes")
    return [ctx.emit1(OpCode.RESIZE, [x], **attrs)]
