"""TFLite data movement: reshapes, transposes, concatenation, pads, slices, splits,
gathers, reductions, resizes, depth/space rearrangements, casts and BATCH_MATMUL."""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.converter.tflite_import.layout import NCHW, LayoutContext
from sporenet.converter.tflite_import.ops.common import Handler, apply_fused, fused_attrs, order_of
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode


def reshape(lc: LayoutContext, op: TfliteOperator) -> None:
    """The output's shape signature is the target when it leaves at most one dimension
    open; else the shape input, a constant or a value computed from the dynamic input
    dimensions (then the runtime reshapes by it once the model is planned)."""
    out = op.outputs[0]
    target = list(lc.shape(out))
    x = lc.get(op.inputs[0])
    if target.count(-1) <= 1:
        lc.set(out, lc.emit(OpCode.RESHAPE, [x], out=out, shape=target))
        return
    given = op.inputs[1] if len(op.inputs) > 1 else -1
    if given == -1 or given not in lc.held:
        # No shape input: the new_shape option may open at most one dimension.
        target = _new_shape(op) or target
        if target.count(-1) <= 1:
            lc.set(out, lc.emit(OpCode.RESHAPE, [x], out=out, shape=target))
            return
        raise lc.fail(f"output shape {target} has more than one open dimension")
    shape = lc.get(given)
    value = lc.ctx.value(shape)
    if value is not None:
        target = [int(v) for v in value.reshape(-1)]
        if target.count(-1) > 1:
            raise lc.fail(f"shape {target} has more than one open dimension")
        lc.set(out, lc.emit(OpCode.RESHAPE, [x], out=out, shape=target, allowzero=1))
        return
    if lc.ctx.view_values(shape) is None:
        raise lc.fail(
            f"output shape {target} has more than one open dimension and the shape input "
            "is not computed from the input's dimensions"
        )
    # A 0 in TFLite's shape is a zero-size dimension (allowzero), not a copied one.
    lc.set(out, lc.emit(OpCode.RESHAPE, [x, shape], out=out, allowzero=1))


def _new_shape(op: TfliteOperator) -> list[int] | None:
    """RESHAPE's target from its new_shape option (files written without a shape input)."""
    o = op.options
    if o is not None and hasattr(o, "NewShapeLength") and o.NewShapeLength():
        return [int(o.NewShape(k)) for k in range(o.NewShapeLength())]
    return None


def squeeze(lc: LayoutContext, op: TfliteOperator) -> None:
    """A SQUEEZE of the squeeze_dims option's axes (every size-1 axis without it)."""
    x, out = op.inputs[0], op.outputs[0]
    rank = lc.rank(x)
    dims = [int(d) for d in op.options.SqueezeDimsAsNumpy()] if _has_dims(op) else []
    if any(not -rank <= d < rank for d in dims):
        raise lc.fail(f"squeeze_dims {dims} are out of range for rank {rank}")
    axes = sorted({d % rank for d in dims})
    if not axes:
        axes = [a for a, d in enumerate(lc.shape(x)) if d == 1]
    y = lc.emit(OpCode.SQUEEZE, [lc.get(x)], out=out, axes=axes)
    lc.set(out, y)


def _has_dims(op: TfliteOperator) -> bool:
    return op.options is not None and op.options.SqueezeDimsLength() > 0


def transpose(lc: LayoutContext, op: TfliteOperator) -> None:
    # out = transpose(x, q): no node, only the recorded order changes.
    x = op.inputs[0]
    q = [int(v) % lc.rank(x) for v in lc.constant_value(op.inputs[1], "perm").reshape(-1)]
    inverse = np.argsort(q)
    current = lc.perm(x)
    ir = lc.held[x][0]
    lc.set(op.outputs[0], ir, tuple(int(inverse[a]) for a in current))


def concatenation(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    rank = lc.rank(out)
    order = order_of(lc, op.inputs, rank)
    axis = op.options.Axis() % rank
    y = lc.emit(
        OpCode.CONCAT,
        [lc.get(i, order) for i in op.inputs],
        out=out,
        order=order,
        axis=order.index(axis),
        **fused_attrs(lc, out, op.options),
    )
    lc.set(out, apply_fused(lc, y, op.options), order)


def reduce(kind: OpCode) -> Handler:
    def reduce(lc: LayoutContext, op: TfliteOperator) -> None:
        x = op.inputs[0]
        rank = lc.rank(x)
        axes = sorted({int(a) % rank for a in lc.constant_value(op.inputs[1], "axes").reshape(-1)})
        keep = bool(op.options.KeepDims()) if op.options is not None else False
        order = lc.perm(x)
        kept = [a for a in order if a not in axes]  # TFLite axes, in the IR's order
        ranks = {a: k for k, a in enumerate(sorted(kept))}
        out_order = order if keep else tuple(ranks[a] for a in kept)
        y = lc.emit(
            kind,
            [lc.get(x, order)],
            out=op.outputs[0],
            order=out_order,
            axes=[order.index(a) for a in axes],
            keepdims=int(keep),
        )
        lc.set(op.outputs[0], y, out_order)

    return reduce


def pad(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    paddings = lc.constant_value(op.inputs[1], "paddings").astype(np.int64)
    order = lc.perm(x)
    attrs: dict[str, Any] = {
        "pads": [int(paddings[a, 0]) for a in order] + [int(paddings[a, 1]) for a in order],
        "mode": "constant",
    }
    if len(op.inputs) > 2 and op.inputs[2] != -1:  # PADV2's constant value
        attrs["value"] = float(lc.constant_value(op.inputs[2], "constant_values").reshape(-1)[0])
    y = lc.emit(OpCode.PAD, [lc.get(x, order)], out=op.outputs[0], order=order, **attrs)
    lc.set(op.outputs[0], y, order)


def space(kind: OpCode) -> Handler:
    def space(lc: LayoutContext, op: TfliteOperator) -> None:
        attrs: dict[str, Any] = {"blocksize": int(op.options.BlockSize())}
        if kind == OpCode.DEPTH_TO_SPACE:
            attrs["mode"] = "DCR"  # TensorFlow's channel order
        y = lc.emit(kind, [lc.get(op.inputs[0], NCHW)], out=op.outputs[0], order=NCHW, **attrs)
        lc.set(op.outputs[0], y, NCHW)

    return space


def resize(mode: str) -> Handler:
    def resize(lc: LayoutContext, op: TfliteOperator) -> None:
        x, out = op.inputs[0], op.outputs[0]
        o = op.options
        align = bool(o.AlignCorners()) if o is not None else False
        half = bool(o.HalfPixelCenters()) if o is not None else False
        attrs: dict[str, Any] = {"mode": mode}
        if align:
            attrs["coordinate_transformation_mode"] = "align_corners"
        elif half:
            attrs["coordinate_transformation_mode"] = "half_pixel"
        else:
            attrs["coordinate_transformation_mode"] = "asymmetric"
        if mode == "nearest":
            # TFLite's half-pixel nearest source is floor((x + 0.5) * in / out): with the
            # half-pixel coordinate c = (x + 0.5) * in / out - 0.5, that is c rounded
            # half up.
            attrs["nearest_mode"] = "round_prefer_ceil" if align or half else "floor"
        n, h, w, c = lc.tensor(out).shape
        y = lc.emit(
            OpCode.RESIZE, [lc.get(x, NCHW)], out=out, order=NCHW, sizes=[n, c, h, w], **attrs
        )
        lc.set(out, y, NCHW)

    return resize


# --------------------------------------------------------------------------- slicing


_WIDE = 2**31 - 1  # an end past any axis (ONNX clamps it)


def _bounds(
    lc: LayoutContext, op: TfliteOperator, k: int, what: str, default: int | None = None
) -> list[list[int]]:
    """Input k of a slice (begin, end, strides) under each assignment of the dynamic
    dimensions: one list when it is a constant, one per probe when it is computed from a
    dynamic dimension (SHAPE arithmetic)."""
    index = op.inputs[k] if k < len(op.inputs) else -1
    if index == -1 and default is not None:
        return [[default] * len(_bounds(lc, op, 1, "begin")[0])]
    if index != -1 and lc.tensor(index).data is None and index in lc.held:
        ir = lc.held[index][0]
        if lc.ctx.value(ir) is None and (values := lc.ctx.view_values(ir)) is not None:
            return [[int(v) for v in np.ravel(value)] for value in values]
    return [[int(v) for v in lc.constant_value(index, what).reshape(-1)]]


def _slice_params(
    o: Any, begins: list[int], ends: list[int], steps: list[int], shape: tuple[int, ...]
) -> tuple[list[int], list[int], list[int]]:
    """ONNX-style starts and ends of a TFLite STRIDED_SLICE on an input of `shape`, and
    the sliced sizes (before shrinking)."""
    begin_mask, end_mask = (o.BeginMask(), o.EndMask()) if o is not None else (0, 0)
    shrink = o.ShrinkAxisMask() if o is not None else 0
    starts, stops, sliced = [], [], []
    for a, (b, e, step) in enumerate(zip(begins, ends, steps, strict=True)):
        if begin_mask >> a & 1:
            b = 0 if step > 0 else _WIDE
        if shrink >> a & 1:
            b = b + shape[a] if b < 0 else b
            e, step = b + 1, 1
        elif end_mask >> a & 1:
            e = _WIDE if step > 0 else -_WIDE
        starts.append(b)
        stops.append(e)
        sliced.append(len(range(*slice(b, min(e, _WIDE), step).indices(shape[a]))))
    return starts, stops, sliced + list(shape[len(begins) :])


def strided_slice(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    x, out = op.inputs[0], op.outputs[0]
    if o is not None and (o.EllipsisMask() or o.NewAxisMask() or o.Offset()):
        raise lc.fail("ellipsis_mask, new_axis_mask and offset are not supported")
    shrink = o.ShrinkAxisMask() if o is not None else 0
    begins, ends = _bounds(lc, op, 1, "begin"), _bounds(lc, op, 2, "end")
    steps = _bounds(lc, op, 3, "strides", default=1)
    xi = lc.get(x)
    views = max(len(begins), len(ends), len(steps))
    per_view = [
        _slice_params(
            o,
            begins[min(v, len(begins) - 1)],
            ends[min(v, len(ends) - 1)],
            steps[min(v, len(steps) - 1)],
            lc.ctx.views[v][xi].shape,
        )
        for v in range(views)
    ]
    starts, stops, sliced = per_view[0]
    step_list = steps[0]
    for other, view in zip(per_view[1:], range(1, views), strict=True):
        for a, (b0, e0, b1, e1) in enumerate(zip(starts, stops, other[0], other[1], strict=True)):
            if (b0, e0) == (b1, e1):
                continue
            dims = [lc.ctx.views[v][xi].shape[a] for v in (0, view)]
            # bounds that follow a dynamic dimension: the whole axis in every probe
            if step_list[a] == 1 and b0 == b1 == 0 and e0 >= dims[0] and e1 >= dims[1]:
                stops[a] = _WIDE
                continue
            raise lc.fail(
                f"the slice of axis {a} depends on a dynamic input dimension "
                f"({[b0, e0]} or {[b1, e1]}); fix that dimension with --input-shape"
            )
    attrs: dict[str, Any] = {
        "starts": starts,
        "ends": stops,
        "axes": list(range(len(starts))),
        "steps": step_list,
    }
    if not shrink:
        lc.set(out, lc.emit(OpCode.SLICE, [xi], out=out, **attrs))
        return
    if lc.quantized(x):
        t = lc.ctx.tensors[xi]
        y = lc.raw(OpCode.SLICE, [xi], sliced, t.dtype, t.quantization, attrs)
    else:
        y = lc.emit(OpCode.SLICE, [xi], **attrs)
    lc.set(out, lc.emit(OpCode.RESHAPE, [y], out=out, shape=list(lc.shape(out))))


def _split(lc: LayoutContext, op: TfliteOperator, x: int, axis: int, sizes: list[int]) -> None:
    order = lc.perm(x)
    axis %= lc.rank(x)
    outs = lc.ctx.emit(
        OpCode.SPLIT,
        [lc.get(x, order)],
        num_outputs=len(op.outputs),
        axis=order.index(axis),
        split=sizes,
    )
    for tfl_out, ir in zip(op.outputs, outs, strict=True):
        lc.set(tfl_out, ir, order)


def split(lc: LayoutContext, op: TfliteOperator) -> None:
    axis = int(lc.constant_value(op.inputs[0], "axis").reshape(-1)[0])
    x = op.inputs[1]
    sizes = [lc.tensor(o).shape[axis % lc.rank(x)] for o in op.outputs]
    _split(lc, op, x, axis, sizes)


def split_v(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    axis = int(lc.constant_value(op.inputs[2], "axis").reshape(-1)[0])
    sizes = [lc.tensor(o).shape[axis % lc.rank(x)] for o in op.outputs]
    _split(lc, op, x, axis, sizes)


def expand_dims(lc: LayoutContext, op: TfliteOperator) -> None:
    """An UNSQUEEZE at the axis input (from the end when negative), so dynamic dimensions
    stay what they are."""
    x, out = op.inputs[0], op.outputs[0]
    rank = lc.rank(x) + 1
    axis = int(lc.constant_value(op.inputs[1], "axis").reshape(-1)[0])
    if not -rank <= axis < rank:
        raise lc.fail(f"axis {axis} is out of range for an output of rank {rank}")
    y = lc.emit(OpCode.UNSQUEEZE, [lc.get(x)], out=out, axes=[axis % rank])
    lc.set(out, y)


def pack(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    axis = op.options.Axis() % lc.rank(out)
    parts = [lc.emit(OpCode.UNSQUEEZE, [lc.get(i)], axes=[axis]) for i in op.inputs]
    lc.set(out, parts[0] if len(parts) == 1 else lc.emit(OpCode.CONCAT, parts, axis=axis))


def unpack(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    axis = op.options.Axis() % lc.rank(x)
    pieces = lc.ctx.emit(OpCode.SPLIT, [lc.get(x)], num_outputs=len(op.outputs), axis=axis)
    for out, piece in zip(op.outputs, pieces, strict=True):
        lc.set(out, lc.emit(OpCode.SQUEEZE, [piece], axes=[axis]))


def batch_matmul(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    a, b = lc.get(op.inputs[0]), lc.get(op.inputs[1])
    for flag, k in ((o is not None and o.AdjX(), 0), (o is not None and o.AdjY(), 1)):
        if flag:
            rank = lc.rank(op.inputs[k])
            perm = [*range(rank - 2), rank - 1, rank - 2]
            if k == 0:
                a = lc.emit(OpCode.TRANSPOSE, [a], perm=perm)
            else:
                b = lc.emit(OpCode.TRANSPOSE, [b], perm=perm)
    lc.set(op.outputs[0], lc.emit(OpCode.MATMUL, [a, b], out=op.outputs[0]))


def gather(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    if o is not None and o.BatchDims():
        raise lc.fail("batch_dims is not supported")
    x = op.inputs[0]
    axis = (o.Axis() if o is not None else 0) % lc.rank(x)
    y = lc.emit(OpCode.GATHER, [lc.get(x), lc.get(op.inputs[1])], axis=axis)
    lc.set(op.outputs[0], y)


def cast(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    dtype = np.dtype(lc.tensor(out).dtype)
    xi = lc.get(x, lc.perm(x))
    if lc.tensor(x).dtype == np.complex64 and dtype != np.complex64:
        # TFLite casts a complex value to a real type by its real part.
        xi = lc.emit(OpCode.COMPLEX_PART, [xi], part="real")
        if dtype == np.float32:
            lc.set(out, xi, lc.perm(x))
            return
    lc.set(out, lc.emit(OpCode.CAST, [xi], to=dtype.name), lc.perm(x))
