"""Gemm and MatMul: FullyConnected when the weights are constant, MatMul otherwise."""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.ops import OpCode


def _transpose2d(ctx: ImportContext, x: int) -> int:
    """x.T: computed now (once per weight) for a stored constant; otherwise a Transpose
    node (folded by the runtime at load time when x is a fill it computes, so the file
    stays small)."""
    tensor = ctx.tensors[x]
    if tensor.data is not None:
        return ctx.derived(("T", x), lambda: _transposed_constant(ctx, x))
    return ctx.emit1(OpCode.TRANSPOSE, [x], perm=[1, 0])


def _transposed_constant(ctx: ImportContext, x: int) -> int:
    tensor = ctx.tensors[x]
    data = cast(np.ndarray, tensor.data)  # a stored constant (_transpose2d checked)
    if tensor.quantization is not None:  # integer weights stay integer
        q = tensor.quantization
        moved = dataclasses.replace(q, axis=1 - q.axis if q.scale.size > 1 else 0)
        return ctx.quantized_constant(f"{tensor.name}/T", np.ascontiguousarray(data.T), moved)
    return ctx.constant(f"{tensor.name}/T", np.ascontiguousarray(data.T))


def _scaled(ctx: ImportContext, x: int, alpha: float) -> int:
    """x * alpha, in the same way as _transpose2d."""
    data = ctx.tensors[x].data
    if alpha == 1.0:
        return x
    q = ctx.tensors[x].quantization
    if data is not None and q is not None:
        scaled = dataclasses.replace(q, scale=(q.scale * np.float32(alpha)).astype(np.float32))
        return ctx.quantized_constant(f"{ctx.tensors[x].name}/scaled", data, scaled)
    if data is not None:
        return ctx.constant(
            f"{ctx.tensors[x].name}/scaled",
            (data * np.asarray(alpha, data.dtype)).astype(data.dtype),
        )
    factor = ctx.constant(f"{ctx.tensors[x].name}/alpha", np.array(alpha, ctx.dtype(x)))
    return ctx.emit1(OpCode.MUL, [x, factor])


def gemm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Y = alpha * A' @ B' + beta * C, with A' = A.T if transA and B' = B.T if transB.

    With a constant float B this is FullyConnected, whose (out, in) weight is B'.T scaled by
    alpha, and whose bias is beta * C when C broadcasts along the output features only.
    """
    a, b, c = node.input(0), node.input(1), node.input(2)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    trans_a, trans_b = int(node.attr("transA", 0)), int(node.attr("transB", 0))
    if ctx.rank(a) != 2 or ctx.rank(b) != 2:
        raise node.fail(
            f"A and B must be 2-D, got shapes {list(ctx.shape(a))} and {list(ctx.shape(b))}"
        )
    if trans_a:
        a = _transpose2d(ctx, a)
    weight = ctx.value(b)
    dtype = ctx.dtype(a)
    c_value = ctx.value(c) if c != -1 else None
    if weight is not None and dtype.kind == "f":
        # FullyConnected weight is (out_features, in_features) = B'.T; with transB and
        # alpha 1 it is the initializer itself, bit for bit.
        w_index = _scaled(ctx, b if trans_b else _transpose2d(ctx, b), alpha)
        n = weight.shape[0] if trans_b else weight.shape[1]
        inputs = [a, w_index]
        if (
            c != -1
            and c_value is not None
            and c_value.size in (1, n)
            and (c_value.ndim == 0 or c_value.shape[-1] in (1, n))
            and (c_value.ndim < 2 or c_value.shape[0] == 1)
        ):
            bias = np.broadcast_to(c_value.reshape(-1), (n,)).astype(dtype)
            if beta != 1.0:
                bias = bias * np.asarray(beta, dtype)
            if beta == 1.0 and c_value.shape == (n,):
                inputs.append(c)
            else:
                inputs.append(
                    ctx.constant(f"{ctx.tensors[c].name}/fc_bias", np.ascontiguousarray(bias))
                )
            return [ctx.emit1(OpCode.FULLY_CONNECTED, inputs)]
        out = ctx.emit1(OpCode.FULLY_CONNECTED, inputs)
    else:
        if trans_b:
            b = _transpose2d(ctx, b)
        out = ctx.emit1(OpCode.MATMUL, [a, b])
        if alpha != 1.0:
            out = ctx.emit1(
                OpCode.MUL, [out, ctx.constant(f"{node.name}/alpha", np.array(alpha, dtype))]
            )
    if c != -1 and beta != 0.0:
        if beta != 1.0:
            if c_value is not None:
                c = ctx.constant(
                    f"{ctx.tensors[c].name}/scaled",
                    (c_value * np.asarray(beta, c_value.dtype)).astype(dtype),
                )
            else:
                c = ctx.emit1(
                    OpCode.MUL, [c, ctx.constant(f"{node.name}/beta", np.array(beta, dtype))]
                )
        out = ctx.emit1(OpCode.ADD, [out, c])
    return [out]


def matmul(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """A constant 2-D float B makes FullyConnected (weights pre-packed); else MatMul."""
    a, b = node.input(0), node.input(1)
    weight = ctx.value(b)
    if (
        weight is not None
        and weight.ndim == 2
        and ctx.dtype(a).kind == "f"
        and (ctx.dtype(a) == weight.dtype)
    ):
        return [ctx.emit1(OpCode.FULLY_CONNECTED, [a, _transpose2d(ctx, b)])]
    return [ctx.emit1(OpCode.MATMUL, [a, b])]
