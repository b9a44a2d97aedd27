"""TFLite elementwise ops, activations and SOFTMAX, in their inputs' axis order."""

from __future__ import annotations

import numpy as np

from sporenet.converter.tflite_import.layout import LayoutContext
from sporenet.converter.tflite_import.ops.common import Handler, apply_fused, fused_attrs, order_of
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.ops import OpCode


def binary(kind: OpCode) -> Handler:
    def binary(lc: LayoutContext, op: TfliteOperator) -> None:
        out = op.outputs[0]
        order = order_of(lc, op.inputs[:2], lc.rank(out))
        a, b = (lc.get_broadcast(i, order) for i in op.inputs[:2])
        attrs = fused_attrs(lc, out, op.options)
        if (
            kind in (OpCode.ADD, OpCode.SUB)
            and lc.quantized(out)
            and lc.tensor(out).dtype == np.int16
        ):
            # TFLite's power-of-two int16 path, taken when the scales allow (true by default)
            o = op.options
            attrs["pot_scale_int16"] = 1 if o is None or o.PotScaleInt16() else 0
        y = lc.emit(kind, [a, b], out=out, order=order, **attrs)
        lc.set(out, apply_fused(lc, y, op.options), order)

    return binary


def unary(kind: OpCode, **attrs: object) -> Handler:
    def unary(lc: LayoutContext, op: TfliteOperator) -> None:
        x = op.inputs[0]
        order = lc.perm(x)
        y = lc.emit(kind, [lc.get(x, order)], out=op.outputs[0], order=order, **attrs)
        lc.set(op.outputs[0], y, order)

    return unary


def leaky_relu(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    order = lc.perm(x)
    alpha = float(op.options.Alpha())
    y = lc.emit(OpCode.LEAKY_RELU, [lc.get(x, order)], out=out, order=order, alpha=alpha)
    lc.set(out, y, order)


def gelu(lc: LayoutContext, op: TfliteOperator) -> None:
    x, out = op.inputs[0], op.outputs[0]
    order = lc.perm(x)
    approximate = "tanh" if op.options is not None and op.options.Approximate() else "none"
    y = lc.emit(OpCode.GELU, [lc.get(x, order)], out=out, order=order, approximate=approximate)
    lc.set(out, y, order)


def prelu(lc: LayoutContext, op: TfliteOperator) -> None:
    x, alpha = op.inputs[:2]
    order = lc.perm(x)
    out = op.outputs[0]
    y = lc.emit(
        OpCode.PRELU, [lc.get(x, order), lc.get_broadcast(alpha, order)], out=out, order=order
    )
    lc.set(out, y, order)


def softmax(lc: LayoutContext, op: TfliteOperator) -> None:
    x = op.inputs[0]
    order = lc.perm(x)
    xi = lc.get(x, order)
    beta = float(op.options.Beta()) if op.options is not None else 1.0
    if beta != 1.0:
        xi = lc.emit(OpCode.MUL, [xi, lc.ctx.constant("beta", np.array(beta, np.float32))])
    if beta != 1.0 and lc.quantized(x):
        raise lc.fail(f"an int8 softmax with beta {beta} is not supported (only 1)")
    y = lc.emit(
        OpCode.SOFTMAX, [xi], out=op.outputs[0], order=order, axis=order.index(len(order) - 1)
    )
    lc.set(op.outputs[0], y, order)
