"""TFLite shape arithmetic, comparisons, logical ops and selection.

SHAPE of a tensor with a dynamic dimension stays a node whose value the import tracks
under each assignment of the dynamic dimensions (as the ONNX import does), so arithmetic
on it (STRIDED_SLICE, PACK, FLOOR_DIV, ...) folds where it can and otherwise runs when the
model is planned. Comparisons and logical ops map onto EQUAL/GREATER/LESS, MUL and MAXIMUM
on bool values; an `a >= b` is `(a > b) or (a == b)`, exact for NaN too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.converter.passes.graph_utils import MATERIALIZE_LIMIT
from sporenet.converter.tflite_import.layout import LayoutContext, Perm, identity
from sporenet.converter.tflite_import.ops.common import Handler, order_of
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.ops import OpCode

_INT_TYPES = {2: np.int32, 4: np.int64}  # TensorType INT32 and INT64 (SHAPE's out_type)


def _pair(lc: LayoutContext, op: TfliteOperator) -> tuple[list[int], Perm]:
    out = op.outputs[0]
    order = order_of(lc, op.inputs[:2], lc.rank(out))
    return [lc.get_broadcast(i, order) for i in op.inputs[:2]], order


def compare(kind: OpCode, *, negate: bool = False, or_equal: bool = False) -> Handler:
    """EQUAL, GREATER, LESS; NOT_EQUAL (negate); GREATER_EQUAL, LESS_EQUAL (or_equal)."""

    def compare(lc: LayoutContext, op: TfliteOperator) -> None:
        (a, b), order = _pair(lc, op)
        raw16 = lc.quantized(op.inputs[0]) and lc.tensor(op.inputs[0]).dtype == np.int16
        if or_equal and raw16:
            # LiteRT orders int16 operands as stored but rescales them for EQUAL: a >= b
            # is the negated opposite order, on the integers.
            opposite = OpCode.LESS if kind == OpCode.GREATER else OpCode.GREATER
            y = _not(lc, lc.emit(opposite, [a, b]))
        else:
            y = lc.emit(kind, [a, b])
        if or_equal and not raw16:
            y = lc.emit(OpCode.MAXIMUM, [y, lc.emit(OpCode.EQUAL, [a, b])])
        if negate:
            y = _not(lc, y)
        lc.set(op.outputs[0], y, order)

    return compare


def _not(lc: LayoutContext, ir: int) -> int:
    return lc.emit(OpCode.EQUAL, [ir, lc.ctx.constant("false", np.array(False))])


def logical(kind: OpCode) -> Handler:
    """LOGICAL_AND (MUL of bools) and LOGICAL_OR (MAXIMUM of bools)."""

    def logical(lc: LayoutContext, op: TfliteOperator) -> None:
        (a, b), order = _pair(lc, op)
        lc.set(op.outputs[0], lc.emit(kind, [a, b]), order)

    return logical


def logical_not(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    lc.set(op.outputs[0], _not(lc, lc.get(x, lc.perm(x))), lc.perm(x))


def select(lc: LayoutContext, op: TfliteOperator) -> None:
    """SELECT_V2 broadcasts its three inputs; SELECT's condition may also be a vector
    choosing whole rows of x and y (their first axis)."""
    cond, x, y = op.inputs[:3]
    out = op.outputs[0]
    rank = lc.rank(out)
    if op.op == "SELECT" and lc.rank(cond) == 1 and rank > 1:
        rows = lc.emit(OpCode.RESHAPE, [lc.get(cond)], shape=[-1] + [1] * (rank - 1))
        xi, yi = lc.get(x), lc.get(y)
        lc.set(out, lc.emit(OpCode.WHERE, [rows, xi, yi], out=out))
        return
    order = order_of(lc, [x, y, cond], rank)
    parts = [lc.get_broadcast(i, order) for i in (cond, x, y)]
    if lc.quantized(out):
        parts = [parts[0], *(_as_stored(lc, i) for i in parts[1:])]
    lc.set(out, lc.emit(OpCode.WHERE, parts, out=out, order=order), order)


def _as_stored(lc: LayoutContext, ir: int) -> int:
    """A quantized constant operand of a quantized SELECT as its stored integers: LiteRT
    copies the integers whatever the parameters, and a constant without quantization is
    not dequantized for the dtype-generic WHERE kernel."""
    value = lc.ctx.value(ir)
    if value is None or not lc.quantized_ir(ir):
        return ir
    return lc.ctx.constant(f"{lc.ctx.tensors[ir].name}/stored", value)


# --------------------------------------------------------------------------- shapes


def shape(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    dtype = lc.tensor(out).dtype or np.dtype(np.int32)
    dims = lc.shape(x)
    if DYNAMIC not in dims:
        lc.set(out, lc.ctx.constant(lc.tensor(out).name, np.array(dims, dtype)))
        return
    ctx = lc.ctx
    ir, order = lc.held[x]
    value = ctx.emit1(OpCode.SHAPE, [ir])
    ctx.set_view_values(value, [np.array(view[ir].shape, np.int64) for view in ctx.views])
    if order != identity(len(order)):  # the IR holds the axes in another order
        picks = ctx.constant("shape_order", np.array([order.index(a) for a in range(len(order))]))
        value = ctx.emit1(OpCode.GATHER, [value, picks], axis=0)
    lc.set(out, ctx.emit1(OpCode.CAST, [value], to=np.dtype(dtype).name))


def _filled(lc: LayoutContext, name: str, value: np.ndarray, dims: int | None, shape: Any) -> int:
    """`value` (a scalar) repeated to a shape: a constant when small and known, else an
    EXPAND the runtime folds when the model loads (dims: an IR tensor holding the shape)."""
    ctx = lc.ctx
    if shape is not None and DYNAMIC not in shape:
        nbytes = int(np.prod(shape, dtype=np.float64)) * value.dtype.itemsize
        if nbytes <= MATERIALIZE_LIMIT:
            return ctx.constant(name, np.full(tuple(shape), value, value.dtype))
        return ctx.emit1(OpCode.EXPAND, [ctx.constant(f"{name}/value", value)], shape=list(shape))
    if dims is None:
        raise lc.fail("the output's shape is not known")
    scalar = ctx.constant(f"{name}/value", value)
    return ctx.emit1(OpCode.EXPAND, [scalar, ctx.emit1(OpCode.CAST, [dims], to="int64")])


def fill(lc: LayoutContext, op: TfliteOperator) -> None:
    dims, value = op.inputs[:2]
    out = op.outputs[0]
    scalar = lc.constant_value(value, "value").reshape(())
    known = lc.ctx.value(lc.get(dims))
    target = [int(d) for d in known.reshape(-1)] if known is not None else None
    lc.set(out, _filled(lc, lc.tensor(out).name, scalar, lc.get(dims), target))


def fill_like(fill_value: int) -> Handler:
    """ZEROS_LIKE: x's shape and dtype, filled with `fill_value`."""

    def fill_like(lc: LayoutContext, op: TfliteOperator) -> None:
        x, out = op.inputs[0], op.outputs[0]
        dtype = lc.tensor(out).dtype or lc.tensor(x).dtype
        scalar = np.array(fill_value, dtype)
        shape = lc.shape(x)
        dims = None
        if DYNAMIC in shape:
            dims = lc.ctx.emit1(OpCode.SHAPE, [lc.get(x)])
        lc.set(out, _filled(lc, lc.tensor(out).name, scalar, dims, shape))

    return fill_like


def range_(lc: LayoutContext, op: TfliteOperator) -> None:
    start, limit, delta = (lc.get(i) for i in op.inputs[:3])
    lc.set(op.outputs[0], lc.emit(OpCode.RANGE, [start, limit, delta]))


_WIDE = 2**31 - 1


def slice_(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    begin = [int(v) for v in lc.constant_value(op.inputs[1], "begin").reshape(-1)]
    size = [int(v) for v in lc.constant_value(op.inputs[2], "size").reshape(-1)]
    if len(begin) != lc.rank(x) or len(size) != lc.rank(x):
        raise lc.fail(f"begin {begin} and size {size} need one value per axis of the input")
    ends = [_WIDE if s == -1 else b + s for b, s in zip(begin, size, strict=True)]
    order = lc.perm(x)
    y = lc.emit(
        OpCode.SLICE,
        [lc.get(x, order)],
        out=out,
        order=order,
        starts=[begin[a] for a in order],
        ends=[ends[a] for a in order],
        axes=list(range(len(order))),
    )
    lc.set(out, y, order)
