"""Reductions over axes, and arg-max/min."""

from __future__ import annotations

from sporenet.lite.kernels import reduce
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.kernels.quantized import reduce as q_reduce
from sporenet.lite.kernels.training import broadcast
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import declare, rule

OPS = (
    declare(
        O.REDUCE_MEAN,
        kernel=reduce.ReduceMean,
        int8=q_reduce.QReduceMean,
        int8_file_only=True,
        grad=rule("transform", "reduce_mean"),
        grad_differentiable=True,
        int16=q_int16.QReduceMean16,
    ),
    declare(
        O.REDUCE_SUM,
        kernel=reduce.ReduceSum,
        int8=q_reduce.QReduceSum,
        int8_file_only=True,
        grad=rule("transform", "reduce_sum"),
        grad_differentiable=True,
        int16=q_int16.QReduceSum16,
    ),
    declare(
        O.REDUCE_MAX,
        kernel=reduce.ReduceMax,
        int8=q_reduce.QReduceMax,
        int8_file_only=True,
        int16=q_int16.QReduceMax16,
    ),
    declare(
        O.REDUCE_MIN,
        kernel=reduce.ReduceMin,
        int8=q_reduce.QReduceMin,
        int8_file_only=True,
        int16=q_int16.QReduceMin16,
    ),
    declare(O.REDUCE_PROD, kernel=reduce.ReduceProd),
    declare(O.ARGMAX, kernel=reduce.ArgMax),
    declare(O.ARGMIN, kernel=reduce.ArgMin),
    # backward of broadcasting and of reductions
    declare(
        O.REDUCE_SUM_TO,
        kernel=broadcast.ReduceSumTo,
        grad=rule("backward", "reduce_sum_to"),
        grad_differentiable=True,
    ),
    declare(
        O.REDUCE_GRAD,
        kernel=broadcast.ReduceGrad,
        grad=rule("backward", "reduce_grad"),
        grad_differentiable=True,
    ),
)
