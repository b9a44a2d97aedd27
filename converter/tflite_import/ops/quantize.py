"""TFLite QUANTIZE and DEQUANTIZE (float16 weights, int8 <-> float, int8 -> int8), and
DENSIFY of sparse weights (expanded when the file is read)."""

from __future__ import annotations

import numpy as np

from sporenet.converter.tflite_import.layout import LayoutContext
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode


def dequantize(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    tensor = lc.tensor(x)
    constant = tensor.data is not None or lc.ctx.value(lc.held[x][0]) is not None
    if tensor.dtype == np.float16 and constant:
        # float16 weights (also sparse ones, expanded behind a DENSIFY): stored as they
        # are, widened when the model loads; a CAST here would leave the runtime a
        # float32 copy in TFLite's layout besides the one the consumer reads.
        lc.set(op.outputs[0], lc.held[x][0], lc.perm(x))
        lc.widened.add(op.outputs[0])
        return
    order = lc.perm(x)
    if tensor.dtype == np.float16:
        lc.set(op.outputs[0], lc.emit(OpCode.CAST, [lc.get(x, order)], to="float32"), order)
        return
    if not lc.quantized(x):
        raise lc.fail(f"input {tensor.name!r} ({tensor.type_name}) has no quantization")
    y = lc.emit(OpCode.DEQUANTIZE, [lc.get(x, order)], out=op.outputs[0], order=order)
    lc.set(op.outputs[0], y, order)


def quantize(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    if not lc.quantized(out):
        raise lc.fail(f"output {lc.tensor(out).name!r} must be int8 or uint8 with quantization")
    order = lc.perm(x)
    kind = OpCode.REQUANTIZE if lc.quantized(x) else OpCode.QUANTIZE
    y = lc.emit(
        kind, [lc.get(x, order)], out=out, order=order, dtype=lc.tensor(out).type_name.lower()
    )
    lc.set(out, y, order)


def densify(lc: LayoutContext, op: TfliteOperator) -> None:
    """DENSIFY of a sparse constant: the reader has already expanded it."""
    x = op.inputs[0]
    if lc.tensor(x).data is None:
        raise lc.fail(f"input {lc.tensor(x).name!r} must be a constant sparse tensor")
    lc.set(op.outputs[0], lc.held[x][0], lc.perm(x))
