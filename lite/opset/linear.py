"""Linear algebra and convolution: fully connected, matmul, convolutions."""

from __future__ import annotations

from sporenet.lite.kernels import conv, conv_transpose, linear
from sporenet.lite.kernels.quantized import conv as q_conv
from sporenet.lite.kernels.quantized import conv_transpose as q_conv_transpose
from sporenet.lite.kernels.quantized import int16_linear as q_int16_linear
from sporenet.lite.kernels.quantized import linear as q_linear
from sporenet.lite.kernels.training import conv_grad
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import FUSABLE, Quant, declare, rule

OPS = (
    declare(
        O.FULLY_CONNECTED,
        kernel=linear.FullyConnected,
        int8=q_linear.QFullyConnected,
        grad=rule("linear", "fully_connected"),
        grad_differentiable=True,
        fuses=FUSABLE,
        weights=(1, 2),
        quant=Quant(weight=(1, 0), bias=2),
        float16_widened=True,
        int16=q_int16_linear.QFullyConnected16,
    ),
    declare(
        O.MATMUL,
        kernel=linear.MatMul,
        int8=q_linear.QMatMul,
        grad=rule("linear", "matmul"),
        grad_differentiable=True,
        weights=(0, 1),
        quant=Quant(weight=(1, -1)),
        float16_widened=True,
        int16=q_linear.QMatMul16,
    ),
    declare(
        O.CONV2D,
        kernel=conv.Conv2D,
        int8=q_conv.QConv2D,
        grad=rule("conv", "conv2d"),
        grad_differentiable=True,
        fuses=FUSABLE,
        weights=(1, 2),
        quant=Quant(weight=(1, 0), bias=2),
        float16_widened=True,
        int16=q_int16_linear.QConv2D16,
    ),
    declare(
        O.CONV_TRANSPOSE2D,
        kernel=conv_transpose.ConvTranspose2D,
        float16_widened=True,
    ),
    declare(
        O.CONV2D_BACKPROP_INPUT,
        kernel=conv_grad.Conv2DBackpropInput,
        int8=q_conv_transpose.QConv2DBackpropInput,
        int8_file_only=True,
        grad=rule("backward", "conv2d_backprop"),
        grad_differentiable=True,
        int16=q_conv_transpose.QConv2DBackpropInput16,
    ),
    declare(
        O.CONV2D_BACKPROP_FILTER,
        kernel=conv_grad.Conv2DBackpropFilter,
        grad=rule("backward", "conv2d_backprop"),
        grad_differentiable=True,
    ),
)
