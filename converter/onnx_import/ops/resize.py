"""Resize (opsets 10, 11+, 18+) and Upsample (opsets 7, 9): the runtime's Resize op.

Static scales or sizes become attributes. Upsample and Resize-10 predate the coordinate
modes: they sample asymmetrically (x_in = x_out / scale) and nearest rounds down.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode

MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "cubic": "cubic"}


def _mode(node: OnnxNode) -> str:
    mode = node.attr("mode", "nearest")
    if mode not in MODES:
        raise node.fail(
            f"mode {mode!r} is not supported (the runtime has nearest, linear and cubic)"
        )
    return MODES[mode]


def _static_floats(ctx: ImportContext, node: OnnxNode, k: int, what: str) -> list[float] | None:
    value = ctx.static_input(node, k, what)
    return None if value is None else [float(v) for v in np.ravel(value)] or None


# keep_aspect_ratio_policy -> how the one scale is chosen among the resized axes' ratios.
POLICIES = {"stretch": None, "not_larger": min, "not_smaller": max}


def _keep_aspect_ratio(
    node: OnnxNode, shape: list[int], sizes: list[int], axes: list[int] | None, pick: object
) -> tuple[list[int], list[float]]:
    """ONNX's keep_aspect_ratio_policy: one scale (the smallest or largest of the resized
    axes' size ratios) for every resized axis, each output size rounded from it."""
    rank = len(shape)
    resized = [a + rank if a < 0 else a for a in axes] if axes is not None else range(rank)
    if any(shape[a] <= 0 for a in resized):
        raise node.fail(f"keep_aspect_ratio_policy needs a static input shape, got {shape}")
    scale = pick(sizes[a] / shape[a] for a in resized)  # type: ignore[operator]
    out_sizes, scales = list(shape), [1.0] * rank
    for a in resized:
        out_sizes[a] = int(np.floor(scale * shape[a] + 0.5))  # round half up, as ONNX
        scales[a] = float(scale)
    return out_sizes, scales


def _roi(ctx: ImportContext, node: OnnxNode, rank: int, axes: list[int] | None) -> list[float]:
    """tf_crop_and_resize's region, [starts..., ends...] over every axis (0 and 1 for the
    axes that `axes` leaves out)."""
    roi = _static_floats(ctx, node, 1, "roi")
    listed = [a + rank if a < 0 else a for a in axes] if axes is not None else list(range(rank))
    if roi is None or len(roi) != 2 * len(listed):
        raise node.fail(
            f"tf_crop_and_resize needs a roi (input 1) of {2 * len(listed)} values, got {roi}"
        )
    starts, ends = [0.0] * rank, [1.0] * rank
    for k, a in enumerate(listed):
        starts[a], ends[a] = roi[k], roi[len(listed) + k]
    return starts + ends


def _spread(
    ctx: ImportContext,
    node: OnnxNode,
    k: int,
    defaults: list[float] | list[int],
    axes: list[int] | None,
    dtype: type,
) -> int:
    """Input k (given for `axes` only, one group per `len(defaults) // rank`) as a tensor of
    one value per axis: the defaults where `axes` leaves an axis out. A Gather from the
    defaults and the given values, so it works on values known only at run time."""
    index = node.input(k)
    if ctx.dtype(index) != dtype:
        index = ctx.emit1(OpCode.CAST, [index], to=str(np.dtype(dtype)))
    if axes is None:
        return index
    rank = ctx.rank(node.input(0))
    listed = [a + rank if a < 0 else a for a in axes]
    picks = list(range(len(defaults)))
    for group in range(len(defaults) // rank):
        for j, a in enumerate(listed):
            picks[group * rank + a] = len(defaults) + group * len(listed) + j
    defaults_tensor = ctx.constant(f"{node.name}/defaults{k}", np.array(defaults, dtype))
    table = ctx.emit1(OpCode.CONCAT, [defaults_tensor, index], axis=0)
    picks_tensor = ctx.constant(f"{node.name}/picks{k}", np.array(picks, np.int64))
    return ctx.emit1(OpCode.GATHER, [table, picks_tensor], axis=0)


def _resize_at_plan_time(
    ctx: ImportContext,
    node: OnnxNode,
    attrs: dict[str, object],
    axes: list[int] | None,
    policy: str,
    crop: bool,
) -> int:
    """Resize whose roi, scales or sizes are shape-like graph inputs: they stay inputs
    (spread over every axis when `axes` lists some), read when the runtime plans the
    graph with their values."""
    x = node.input(0)
    shape = list(ctx.spec(x).shape)
    rank = len(shape)
    inputs = [x, -1, -1, -1]
    if crop:
        inputs[1] = _spread(ctx, node, 1, [0.0] * rank + [1.0] * rank, axes, np.float32)
        attrs["extrapolation_value"] = float(node.attr("extrapolation_value", 0.0))
    sizes, scales = node.input(3), node.input(2)
    if sizes != -1:
        inputs[3] = _spread(ctx, node, 3, shape, axes, np.int64)
    elif scales != -1:
        inputs[2] = _spread(ctx, node, 2, [1.0] * rank, axes, np.float32)
    else:
        raise node.fail("needs scales or sizes")
    if policy != "stretch":
        attrs["keep_aspect_ratio_policy"] = policy
        if axes is not None:  # the one scale is picked among, and applied to, these only
            attrs["keep_aspect_ratio_axes"] = [a + rank if a < 0 else a for a in axes]
    while inputs[-1] == -1:
        inputs.pop()
    return ctx.emit1(OpCode.RESIZE, inputs, **attrs)


def upsample(ctx: ImportContext, node: OnnxNode) -> list[int]:
    if node.opset >= 9 and node.input(1) in ctx.fed and ctx.value(node.input(1)) is None:
        attrs = {"mode": _mode(node), "coordinate_transformation_mode": "asymmetric"}
        attrs["nearest_mode"] = "floor"
        scales = ctx.emit1(OpCode.CAST, [node.input(1)], to="float32")
        return [ctx.emit1(OpCode.RESIZE, [node.input(0), -1, scales], **attrs)]
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


def _sampling_attrs(node: OnnxNode, mode: str) -> dict[str, object]:
    """The runtime Resize's attributes for how it samples (Resize-11 and later)."""
    attrs: dict[str, object] = {
        "mode": mode,
        "coordinate_transformation_mode": node.attr("coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": node.attr("nearest_mode", "round_prefer_floor"),
    }
    for name in ("antialias", "exclude_outside"):
        if int(node.attr(name, 0)):
            attrs[name] = 1
    if mode == "cubic":
        attrs["cubic_coeff_a"] = float(node.attr("cubic_coeff_a", -0.75))
    return attrs


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
    attrs = _sampling_attrs(node, mode)
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in POLICIES:
        raise node.fail(
            f"keep_aspect_ratio_policy must be one of {sorted(POLICIES)}, got {policy!r}"
        )
    axes = node.ints("axes")
    dynamic = [k for k in (2, 3) if node.input(k) != -1 and ctx.value(node.input(k)) is None]
    crop = attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    fed = [k for k in (1, 2, 3) if node.input(k) != -1 and node.input(k) in ctx.fed]
    if fed:
        return [_resize_at_plan_time(ctx, node, attrs, axes, policy, crop)]
    if dynamic and axes is None and policy == "stretch" and not crop:
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
    if crop:
        attrs["roi"] = _roi(ctx, node, rank, axes)
        attrs["extrapolation_value"] = float(node.attr("extrapolation_value", 0.0))
    if sizes is not None and policy != "stretch":
        attrs["sizes"], attrs["scales"] = _keep_aspect_ratio(
            node, list(ctx.spec(x).shape), sizes, axes, POLICIES[policy]
        )
    elif sizes is not None:
        attrs["sizes"] = sizes
    elif scales is not None:
        attrs["scales"] = scales
    else:
        raise node.fail("needs scales or sizes")
    return [ctx.emit1(OpCode.RESIZE, [x], **attrs)]
