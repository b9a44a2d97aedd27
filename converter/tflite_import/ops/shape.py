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
    out = op.outputs[0]
    target = list(lc.shape(out))
    if target.count(-1) > 1:
        # The output leaves several dimensions open: the new shape the operator holds
        # (its shape input, or new_shape) opens at most one.
        target = _new_shape(lc, op) or target
    if target.count(-1) > 1:
        raise lc.fail(f"output shape {target} has more than one open dimension")
    lc.set(out, lc.emit(OpCode.RESHAPE, [lc.get(op.inputs[0])], out=out, shape=target))


def _new_shape(lc: LayoutContext, op: TfliteOperator) -> list[int] | None:
    """RESHAPE's target from its constant shape input or its new_shape option."""
    if len(op.inputs) > 1 and op.inputs[1] != -1:
        t = lc.tensor(op.inputs[1])
        value = t.data if t.data is not None else lc.ctx.value(lc.held[op.inputs[1]][0])
        if value is not None:
            return [int(v) for v in np.asarray(value).reshape(-1)]
    o = op.options
    if o is not None and hasattr(o, "NewShapeLength") and o.NewShapeLength():
        return [int(o.NewShape(k)) for k in range(o.NewShapeLength())]
    return None


def squeeze(lc: LayoutContext, op: TfliteOperator) -> None:
    # A Squeeze of the axes it names (or of every unit axis), not a Reshape to the
    # output's shape: that shape may leave several dimensions open.
    x, out = op.inputs[0], op.outputs[0]
    rank = lc.rank(x)
    o = op.options
    named = [int(o.SqueezeDims(k)) for k in range(o.SqueezeDimsLength())] if o is not None else []
    axes = sorted({a % rank for a in named} or {a for a, d in enumerate(lc.shape(x)) if d == 1})
    lc.set(out, lc.emit(OpCode.SQUEEZE, [lc.get(x)], out=out, axes=axes))


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
        elif half and mode == "linear":
            attrs["coordinate_transformation_mode"] = "half_pixel"
        elif half:
            raise lc.fail("nearest-neighbour resizing with half_pixel_centers is not supported")
        else:
            attrs["coordinate_transformation_mode"] = "asymmetric"
        if mode == "nearest":
            attrs["nearest_mode"] = "round_prefer_ceil" if align else "floor"
        n, h, w, c = lc.tensor(out).shape
        y = lc.emit(
            OpCode.RESIZE, [lc.get(x, NCHW)], out=out, order=NCHW, sizes=[n, c, h, w], **attrs
        )
        lc.set(out, y, NCHW)

    return resize


# --------------------------------------------------------------------------- slicing


_WIDE = 2**31 - 1  # an end past any axis (ONNX clamps it)


def strided_slice(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    x, out = op.inputs[0], op.outputs[0]
    if o is not None and (o.EllipsisMask() or o.NewAxisMask() or o.Offset()):
        raise lc.fail("ellipsis_mask, new_axis_mask and offset are not supported")
    begin_mask, end_mask = (o.BeginMask(), o.EndMask()) if o is not None else (0, 0)
    shrink = o.ShrinkAxisMask() if o is not None else 0
    begins = [int(v) for v in lc.constant_value(op.inputs[1], "begin").reshape(-1)]
    ends = [int(v) for v in lc.constant_value(op.inputs[2], "end").reshape(-1)]
    steps = (
        [int(v) for v in lc.constant_value(op.inputs[3], "strides").reshape(-1)]
        if len(op.inputs) > 3 and op.inputs[3] != -1
        else [1] * len(begins)
    )
    shape = lc.tensor(x).shape
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
    sliced += shape[len(begins) :]
    attrs: dict[str, Any] = {
        "starts": starts,
        "ends": stops,
        "axes": list(range(len(begins))),
        "steps": steps,
    }
    xi = lc.get(x)
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
    # An Unsqueeze, not a Reshape to the output's shape: that shape may leave several
    # dimensions open (a dynamic batch and a dynamic length).
    out = op.outputs[0]
    axis = int(lc.constant_value(op.inputs[1], "axis").reshape(-1)[0]) % lc.rank(out)
    lc.set(out, lc.emit(OpCode.UNSQUEEZE, [lc.get(op.inputs[0])], out=out, axes=[axis]))


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
    lc.set(op.outputs[0], lc.emit(OpCode.MATMUL, [a, b]))


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
    dtype = lc.tensor(out).dtype
    y = lc.emit(OpCode.CAST, [lc.get(x, lc.perm(x))], to=np.dtype(dtype).name)
    lc.set(out, y, lc.perm(x))
