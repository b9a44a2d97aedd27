"""ReduceLogSumExp as log(sum(exp(x - m))) + m with m the max over the same axes: without
the shift, float32 exp underflows for the large negative log-likelihoods of naive Bayes
(and overflows for large positive ones), where onnxruntime's kernel stays exact."""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops.reduce import _reduce
from sporenet.lite.ops import OpCode


def reduce_log_sum_exp(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    kept = OnnxNode(
        node.op_type,
        node.name,
        node.inputs,
        node.outputs,
        {**node.attrs, "keepdims": 1},
        node.opset,
    )
    top = _reduce(ctx, kept, OpCode.REDUCE_MAX, x)
    zero = ctx.constant(f"{node.name}/zero", np.array(0, ctx.dtype(x)))
    # An all -inf (or empty) slice has no finite max: shift it by 0 instead.
    finite = ctx.emit1(OpCode.EQUAL, [ctx.emit1(OpCode.SUB, [top, top]), zero])
    shift = ctx.emit1(OpCode.WHERE, [finite, top, zero])
    shifted = ctx.emit1(OpCode.EXP, [ctx.emit1(OpCode.SUB, [x, shift])])
    total = ctx.emit1(OpCode.LOG, [_reduce(ctx, node, OpCode.REDUCE_SUM, shifted)])
    if not int(node.attr("keepdims", 1)):
        shift = _reduce(ctx, node, OpCode.REDUCE_MAX, shift)  # the kept axes dropped
    return [ctx.emit1(OpCode.ADD, [total, shift])]
