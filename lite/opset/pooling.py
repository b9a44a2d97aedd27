"""Pooling: windows, global pools, max pooling with indices."""

from __future__ import annotations

from sporenet.lite.kernels import argmax_pool, pooling
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.kernels.quantized import pooling as q_pooling
from sporenet.lite.kernels.training import pool_grad
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import Channels, Quant, declare, rule

OPS = (
    declare(
        O.MAX_POOL2D,
        kernel=pooling.MaxPool2D,
        int8=q_pooling.QMaxPool2D,
        grad=rule("pooling", "max_pool2d"),
        grad_differentiable=True,
        channels=Channels.PASS,
        quant=Quant(keeps_params=True),
        int16=q_int16.QMaxPool2D16,
    ),
    declare(
        O.AVG_POOL2D,
        kernel=pooling.AvgPool2D,
        int8=q_pooling.QAvgPool2D,
        grad=rule("pooling", "avg_pool2d"),
        grad_differentiable=True,
        channels=Channels.PASS,
        int16=q_int16.QAvgPool2D16,
    ),
    declare(
        O.GLOBAL_AVG_POOL,
        kernel=pooling.GlobalAvgPool,
        int8=q_pooling.QGlobalAvgPool,
        grad=rule("pooling", "global_avg_pool"),
        grad_differentiable=True,
        channels=Channels.PASS,
    ),
    declare(
        O.GLOBAL_MAX_POOL,
        kernel=pooling.GlobalMaxPool,
        grad=rule("pooling", "global_max_pool"),
        grad_differentiable=True,
        channels=Channels.PASS,
        quant=Quant(keeps_params=True),
    ),
    declare(
        O.MAX_POOL2D_GRAD,
        kernel=pool_grad.MaxPool2DGrad,
        grad=rule("backward", "max_pool2d_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.MAX_POOL2D_SELECT,
        kernel=pool_grad.MaxPool2DSelect,
        grad=rule("backward", "max_pool2d_select"),
        grad_differentiable=True,
    ),
    declare(
        O.AVG_POOL2D_GRAD,
        kernel=pool_grad.AvgPool2DGrad,
        grad=rule("backward", "avg_pool2d_grad"),
        grad_differentiable=True,
    ),
    declare(O.MAX_POOL_WITH_ARGMAX, kernel=argmax_pool.MaxPoolWithArgmax),
    declare(O.MAX_UNPOOL, kernel=argmax_pool.MaxUnpool),
)
