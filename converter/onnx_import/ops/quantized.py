"""Quantized ONNX ops: the dynamic-quantization family and the QDQ / QLinear family.

Dynamic quantization (onnxruntime's quantize_dynamic) computes integer products of
activations quantized at run time: DynamicQuantizeLinear runs as float ops that produce
the same uint8 values, scale and zero point; MatMulInteger and ConvInteger subtract the
zero points and run the float kernels on integer-valued floats, whose weights are stored
as int8 (zero point in their quantization, dequantized once at load) and whose integer
results are cast to int32 as ONNX declares.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import conv as conv_ops
from sporenet.lite.graph import Quantization
from sporenet.lite.ops import OpCode

ROUNDER = np.float32(1.5 * 2**23)
"""(v + ROUNDER) - ROUNDER rounds a float32 |v| < 2**22 to the nearest integer, ties to
even, as ONNX's quantization ops round (the runtime has no Round op)."""


def _round(ctx: ImportContext, x: int, name: str) -> int:
    c = ctx.constant(f"{name}/rounder", np.array(ROUNDER, np.float32))
    return ctx.emit1(OpCode.SUB, [ctx.emit1(OpCode.ADD, [x, c]), c])


def _scalar(ctx: ImportContext, name: str, value: float) -> int:
    return ctx.constant(name, np.array(value, np.float32))


def dynamic_quantize_linear(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """y = saturate(round(x / scale) + zp) over [min(x, 0), max(x, 0)] mapped to 0..255."""
    x = node.input(0)
    if ctx.dtype(x) != np.float32:
        raise node.fail(f"x must be float32, got {ctx.dtype(x)}")
    zero = _scalar(ctx, f"{node.name}/zero", 0.0)
    lo = ctx.emit1(OpCode.MINIMUM, [ctx.emit1(OpCode.REDUCE_MIN, [x], keepdims=0), zero])
    hi = ctx.emit1(OpCode.MAXIMUM, [ctx.emit1(OpCode.REDUCE_MAX, [x], keepdims=0), zero])
    scale = ctx.emit1(OpCode.DIV, [ctx.emit1(OpCode.SUB, [hi, lo]),
                                   _scalar(ctx, f"{node.name}/levels", 255.0)])
    top = _scalar(ctx, f"{node.name}/top", 255.0)

    def saturate(v: int) -> int:
        return ctx.emit1(OpCode.MINIMUM, [ctx.emit1(OpCode.MAXIMUM, [v, zero]), top])

    zp = saturate(_round(ctx, ctx.emit1(OpCode.NEG, [ctx.emit1(OpCode.DIV, [lo, scale])]),
                         f"{node.name}/zp"))
    y = saturate(ctx.emit1(OpCode.ADD, [_round(ctx, ctx.emit1(OpCode.DIV, [x, scale]),
                                               f"{node.name}/y"), zp]))
    return [ctx.emit1(OpCode.CAST, [y], to="uint8"), scale,
            ctx.emit1(OpCode.CAST, [zp], to="uint8")]


def _centred(ctx: ImportContext, node: OnnxNode, x: int, zp_index: int, what: str) -> int:
    """float32(x) - zero_point for an integer activation."""
    if ctx.dtype(x).kind not in "iu":
        raise node.fail(f"{what} must be int8 or uint8, got {ctx.dtype(x)}")
    xf = ctx.emit1(OpCode.CAST, [x], to="float32")
    if zp_index == -1:
        return xf
    zp = ctx.value(zp_index)
    if zp is not None and zp.size == 1 and int(zp.reshape(-1)[0]) == 0:
        return xf
    return ctx.emit1(OpCode.SUB, [xf, ctx.emit1(OpCode.CAST, [zp_index], to="float32")])


def _int_weight(ctx: ImportContext, node: OnnxNode, w: np.ndarray, zp: np.ndarray | None,
                axis: int, name: str) -> int:
    """w - zp as a constant stored int8 with its zero point (uint8 values move by 128)."""
    if w.dtype not in (np.int8, np.uint8):
        raise node.fail(f"the weights must be int8 or uint8, got {w.dtype}")
    zp = np.zeros(1, np.int64) if zp is None else zp.astype(np.int64).reshape(-1)
    values = w.astype(np.int16)
    if w.dtype == np.uint8:
        values, zp = values - 128, zp - 128
    if zp.size not in (1, w.shape[axis]):
        raise node.fail(f"{zp.size} weight zero points for {w.shape[axis]} channels")
    q = Quantization(scale=np.ones(zp.size, np.float32), zero_point=zp, axis=axis)
    return ctx.quantized_constant(name, values.astype(np.int8), q)


def matmul_integer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """(A - a_zp) @ (B - b_zp) in int32."""
    a, b = node.input(0), node.input(1)
    af = _centred(ctx, node, a, node.input(2), "A")
    weight = ctx.value(b)
    zp_b = ctx.value(node.input(3)) if node.input(3) != -1 else None
    if weight is not None and weight.ndim == 2 and (node.input(3) == -1 or zp_b is not None):
        w = _int_weight(ctx, node, np.ascontiguousarray(weight.T), zp_b, 0,
                        f"{ctx.tensors[b].name}/T")
        y = ctx.emit1(OpCode.FULLY_CONNECTED, [af, w])
    else:
        y = ctx.emit1(OpCode.MATMUL, [af, _centred(ctx, node, b, node.input(3), "B")])
    return [ctx.emit1(OpCode.CAST, [y], to="int32")]


def conv_integer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Conv of (x - x_zp) and (w - w_zp) in int32 (padding adds zeros of x - x_zp)."""
    x, w = node.input(0), node.input(1)
    xf = _centred(ctx, node, x, node.input(2), "x")
    weight = ctx.static_input(node, 1, "the weights")
    zp_w = ctx.static_input(node, 3, "the weight zero point")
    wq = _int_weight(ctx, node, weight, zp_w, 0, f"{ctx.tensors[w].name}/int8")
    y = conv_ops.conv(ctx, dataclasses.replace(node, inputs=[xf, wq]))[0]
    return [ctx.emit1(OpCode.CAST, [y], to="int32")]
