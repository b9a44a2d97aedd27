"""Unary elementwise ops: activations and math functions."""

from __future__ import annotations

from sporenet.lite.autodiff.rules import unary as r_unary
from sporenet.lite.kernels import unary
from sporenet.lite.kernels.quantized import activation as q_activation
from sporenet.lite.kernels.quantized import elementwise_extra as q_extra
from sporenet.lite.kernels.quantized import int16 as q_int16
from sporenet.lite.kernels.quantized import int16_lut as q_int16_lut
from sporenet.lite.kernels.quantized import int16_sigmoid as q_int16_sigmoid
from sporenet.lite.kernels.quantized import lookup as q_lookup
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import Activation, Channels, Quant, declare

A, PASS = Activation, Channels.PASS

OPS = (
    # activations (each also a fused `activation` of Conv2D, FullyConnected, Add, ...)
    declare(
        O.RELU,
        kernel=unary.Relu,
        int8=q_activation.QRelu,
        grad=r_unary.relu,
        grad_differentiable=True,
        activation=A.RELU,
        channels=PASS,
        int16=q_int16.QRelu16,
    ),
    declare(
        O.RELU6,
        kernel=unary.Relu6,
        int8=q_activation.QRelu6,
        grad=r_unary.relu6,
        grad_differentiable=True,
        activation=A.RELU6,
        channels=PASS,
        int16=q_int16.QRelu6_16,
    ),
    declare(
        O.CLIP,
        kernel=unary.Clip,
        int8=q_activation.QClip,
        grad=r_unary.clip,
        grad_differentiable=True,
        channels=PASS,
    ),
    declare(
        O.LEAKY_RELU,
        kernel=unary.LeakyRelu,
        int8=q_extra.QLeakyRelu,
        int8_file_only=True,
        grad=r_unary.leaky_relu,
        grad_differentiable=True,
        activation=A.LEAKY_RELU,
        channels=PASS,
        int16=q_int16.QLeakyRelu16,
    ),
    declare(
        O.PRELU,
        kernel=unary.PRelu,
        int8=q_extra.QPRelu,
        int8_file_only=True,
        grad=r_unary.prelu,
        weights=(1,),
        int16=q_int16.QPRelu16,
    ),
    declare(
        O.SIGMOID,
        kernel=unary.Sigmoid,
        int8=q_activation.QLogistic,
        grad=r_unary.sigmoid,
        grad_differentiable=True,
        activation=A.SIGMOID,
        channels=PASS,
        quant=Quant(fixed_output=(1.0 / 256, -128)),
        int16=q_int16_sigmoid.QLogistic16,
    ),
    declare(
        O.TANH,
        kernel=unary.Tanh,
        int8=q_activation.QTanh,
        grad=r_unary.tanh,
        grad_differentiable=True,
        activation=A.TANH,
        channels=PASS,
        quant=Quant(fixed_output=(1.0 / 128, 0)),
        int16=q_int16_sigmoid.QTanh16,
    ),
    declare(
        O.HARD_SIGMOID,
        kernel=unary.HardSigmoid,
        grad=r_unary.hard_sigmoid,
        grad_differentiable=True,
        activation=A.HARD_SIGMOID,
        channels=PASS,
    ),
    declare(
        O.HARD_SWISH,
        kernel=unary.HardSwish,
        int8=q_activation.QHardSwish,
        grad=r_unary.hard_swish,
        grad_differentiable=True,
        activation=A.HARD_SWISH,
        channels=PASS,
    ),
    declare(
        O.SILU,
        kernel=unary.Silu,
        int8=q_activation.QSilu,
        grad=r_unary.silu,
        grad_differentiable=True,
        activation=A.SILU,
        channels=PASS,
    ),
    declare(
        O.GELU,
        kernel=unary.Gelu,
        int8=q_lookup.QGelu,
        int8_file_only=True,
        grad=r_unary.gelu,
        grad_differentiable=True,
        activation=A.GELU,
        channels=PASS,
        int16=q_int16_lut.QGelu16,
    ),
    declare(
        O.ELU,
        kernel=unary.Elu,
        int8=q_lookup.QElu,
        int8_file_only=True,
        grad=r_unary.elu,
        grad_differentiable=True,
        activation=A.ELU,
        channels=PASS,
    ),
    declare(
        O.SOFTPLUS,
        kernel=unary.Softplus,
        grad=r_unary.softplus,
        grad_differentiable=True,
        activation=A.SOFTPLUS,
    ),
    # math
    declare(
        O.EXP,
        kernel=unary.Exp,
        int8=q_lookup.QExp,
        int8_file_only=True,
        grad=r_unary.exp,
        grad_differentiable=True,
        int16=q_int16_lut.QExp16,
    ),
    declare(
        O.LOG,
        kernel=unary.Log,
        int8=q_lookup.QLog,
        int8_file_only=True,
        grad=r_unary.log,
        grad_differentiable=True,
        int16=q_int16_lut.QLog16,
    ),
    declare(O.SQRT, kernel=unary.Sqrt, grad=r_unary.sqrt, grad_differentiable=True),
    declare(
        O.RSQRT,
        kernel=unary.Rsqrt,
        int8=q_lookup.QRsqrt,
        int8_file_only=True,
        int16=q_int16_lut.QRsqrt16,
    ),
    declare(
        O.NEG,
        kernel=unary.Neg,
        int8=q_lookup.QNeg,
        int8_file_only=True,
        grad=r_unary.neg,
        grad_differentiable=True,
        int16=q_int16.QNeg16,
    ),
    declare(
        O.ABS,
        kernel=unary.Abs,
        int8=q_lookup.QAbs,
        int8_file_only=True,
        grad=r_unary.abs_,
        grad_differentiable=True,
        int16=q_int16.QAbs16,
    ),
    declare(
        O.RECIPROCAL,
        kernel=unary.Reciprocal,
        grad=r_unary.reciprocal,
        grad_differentiable=True,
    ),
    declare(O.ERF, kernel=unary.Erf),
    declare(O.FLOOR, kernel=unary.Floor),
    declare(O.CEIL, kernel=unary.Ceil),
    declare(O.SQUARE, kernel=unary.Square, grad=r_unary.square, grad_differentiable=True),
    declare(O.SIN, kernel=unary.Sin),
    declare(O.COS, kernel=unary.Cos),
    declare(O.ROUND, kernel=unary.Round),
    declare(O.SIGN, kernel=unary.Sign),
)
