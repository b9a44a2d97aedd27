"""TFLite math and data movement beyond the basic set: SQUARED_DIFFERENCE,
L2_NORMALIZATION, LOCAL_RESPONSE_NORMALIZATION, LOG_SOFTMAX, ARG_MAX/ARG_MIN, REVERSE_V2,
MIRROR_PAD, TILE, BROADCAST_TO, GATHER_ND, CUMSUM, ONE_HOT, and the signal ops RFFT2D,
REAL, IMAG and COMPLEX_ABS (complex64 tensors)."""

from __future__ import annotations

import numpy as np

from sporenet.converter.tflite_import.layout import NCHW, LayoutContext
from sporenet.converter.tflite_import.ops.common import Handler, order_of
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode
from sporenet.proto import tflite_schema_generated as tfl

_WIDE = 2**31 - 1


def squared_difference(lc: LayoutContext, op: TfliteOperator) -> None:
    out = op.outputs[0]
    order = order_of(lc, op.inputs[:2], lc.rank(out))
    a, b = (lc.get_broadcast(i, order) for i in op.inputs[:2])
    y = lc.emit(OpCode.SQUARED_DIFFERENCE, [a, b], out=out, order=order)
    lc.set(out, y, order)


def l2_normalization(lc: LayoutContext, op: TfliteOperator) -> None:
    # TFLite: x / max(sqrt(sum of squares over the last axis), 1e-6).
    x = op.inputs[0]
    order = lc.perm(x)
    xi = lc.get(x, order)
    axis = order.index(lc.rank(x) - 1)
    if lc.quantized(x):  # TFLite's integer form
        y = lc.emit(OpCode.L2_NORMALIZATION, [xi], out=op.outputs[0], order=order, axis=axis)
        lc.set(op.outputs[0], y, order)
        return
    squares = lc.emit(OpCode.MUL, [xi, xi])
    total = lc.emit(OpCode.REDUCE_SUM, [squares], axes=[axis], keepdims=1)
    norm = lc.emit(
        OpCode.MAXIMUM,
        [lc.emit(OpCode.SQRT, [total]), lc.ctx.constant("epsilon", np.array(1e-6, np.float32))],
    )
    lc.set(op.outputs[0], lc.emit(OpCode.DIV, [xi, norm]), order)


def local_response_normalization(lc: LayoutContext, op: TfliteOperator) -> None:
    # TFLite: x / (bias + alpha * sum of squares over 2 * radius + 1 channels) ** beta;
    # the IR's LRN (ONNX's) divides alpha by the window size.
    o = op.options
    size = 2 * int(o.Radius()) + 1
    y = lc.emit(
        OpCode.LRN,
        [lc.get(op.inputs[0], NCHW)],
        size=size,
        alpha=float(o.Alpha()) * size,
        beta=float(o.Beta()),
        bias=float(o.Bias()),
    )
    lc.set(op.outputs[0], y, NCHW)


def log_softmax(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    order = lc.perm(x)
    axis = order.index(lc.rank(x) - 1)
    out = op.outputs[0]
    lc.set(
        out, lc.emit(OpCode.LOG_SOFTMAX, [lc.get(x, order)], out=out, order=order, axis=axis), order
    )


def arg(kind: OpCode) -> Handler:
    """ARG_MAX and ARG_MIN over one axis (the first extreme on ties), int32 or int64."""

    def arg(lc: LayoutContext, op: TfliteOperator) -> None:
        x, out = op.inputs[0], op.outputs[0]
        rank = lc.rank(x)
        axis = int(lc.constant_value(op.inputs[1], "axis").reshape(-1)[0]) % rank
        order = lc.perm(x)
        kept = [a for a in order if a != axis]
        ranks = {a: k for k, a in enumerate(sorted(kept))}
        y = lc.emit(kind, [lc.get(x, order)], axis=order.index(axis), keepdims=0)
        dtype = lc.tensor(out).dtype
        if dtype is not None and dtype != np.int64:
            y = lc.emit(OpCode.CAST, [y], to=np.dtype(dtype).name)
        lc.set(out, y, tuple(ranks[a] for a in kept))

    return arg


def reverse_v2(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    rank = lc.rank(x)
    axes = sorted({int(a) % rank for a in lc.constant_value(op.inputs[1], "axis").reshape(-1)})
    order = lc.perm(x)
    held = [order.index(a) for a in axes]
    y = lc.emit(
        OpCode.SLICE,
        [lc.get(x, order)],
        out=op.outputs[0],
        order=order,
        starts=[-1] * len(held),
        ends=[-_WIDE] * len(held),
        axes=held,
        steps=[-1] * len(held),
    )
    lc.set(op.outputs[0], y, order)


def mirror_pad(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    mode = op.options.Mode() if op.options is not None else tfl.MirrorPadMode.REFLECT
    name = {tfl.MirrorPadMode.REFLECT: "reflect", tfl.MirrorPadMode.SYMMETRIC: "symmetric"}
    if mode not in name:
        raise lc.fail(f"mirror pad mode {mode} is neither REFLECT nor SYMMETRIC")
    paddings = lc.constant_value(op.inputs[1], "paddings").astype(np.int64)
    order = lc.perm(x)
    pads = [int(paddings[a, 0]) for a in order] + [int(paddings[a, 1]) for a in order]
    y = lc.emit(
        OpCode.PAD, [lc.get(x, order)], out=op.outputs[0], order=order, pads=pads, mode=name[mode]
    )
    lc.set(op.outputs[0], y, order)


def tile(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    multiples = [int(v) for v in lc.constant_value(op.inputs[1], "multiples").reshape(-1)]
    order = lc.perm(x)
    y = lc.emit(
        OpCode.TILE,
        [lc.get(x, order)],
        out=op.outputs[0],
        order=order,
        repeats=[multiples[a] for a in order],
    )
    lc.set(op.outputs[0], y, order)


def broadcast_to(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    shape = [int(v) for v in lc.constant_value(op.inputs[1], "shape").reshape(-1)]
    y = lc.emit(OpCode.EXPAND, [lc.get(x)], out=out, shape=shape)
    lc.set(out, y)


def gather_nd(lc: LayoutContext, op: TfliteOperator) -> None:
    params, indices = op.inputs[:2]
    y = lc.emit(OpCode.GATHER_ND, [lc.get(params), lc.get(indices)], out=op.outputs[0])
    lc.set(op.outputs[0], y)


def cumsum(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    o = op.options
    axis = int(lc.constant_value(op.inputs[1], "axis").reshape(-1)[0]) % lc.rank(x)
    order = lc.perm(x)
    y = lc.emit(
        OpCode.CUMSUM,
        [lc.get(x, order), lc.ctx.constant("axis", np.array(order.index(axis), np.int64))],
        exclusive=int(bool(o is not None and o.Exclusive())),
        reverse=int(bool(o is not None and o.Reverse())),
    )
    lc.set(op.outputs[0], y, order)


def one_hot(lc: LayoutContext, op: TfliteOperator) -> None:
    indices, depth, on, off = op.inputs[:4]
    out = op.outputs[0]
    axis = int(op.options.Axis()) if op.options is not None else -1
    values = np.stack(
        [
            lc.constant_value(off, "off_value").reshape(()),
            lc.constant_value(on, "on_value").reshape(()),
        ]
    )
    y = lc.emit(
        OpCode.ONE_HOT,
        [
            lc.get(indices),
            lc.ctx.constant("depth", lc.constant_value(depth, "depth").reshape(())),
            lc.ctx.constant("values", values),
        ],
        axis=axis % lc.rank(out),
    )
    lc.set(out, y)


def rfft2d(lc: LayoutContext, op: TfliteOperator) -> None:
    x, length = op.inputs[:2]
    fft_length = lc.ctx.constant("fft_length", lc.constant_value(length, "fft_length"))
    lc.set(op.outputs[0], lc.emit(OpCode.RFFT2D, [lc.get(x), fft_length]))


def complex_part(part: str) -> Handler:
    """REAL, IMAG and COMPLEX_ABS of a complex64 tensor, in its axis order."""

    def complex_part(lc: LayoutContext, op: TfliteOperator) -> None:
        x = op.inputs[0]
        order = lc.perm(x)
        lc.set(op.outputs[0], lc.emit(OpCode.COMPLEX_PART, [lc.get(x, order)], part=part), order)

    return complex_part
