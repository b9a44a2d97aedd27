"""Normalization and softmax: batch, layer, instance, L2 and local response norms."""

from __future__ import annotations

from sporenet.lite.kernels import l2_norm, layer_norm, normalization, softmax
from sporenet.lite.kernels.quantized import int16_softmax as q_int16_softmax
from sporenet.lite.kernels.quantized import l2_norm as q_l2_norm
from sporenet.lite.kernels.quantized import softmax as q_softmax
from sporenet.lite.kernels.training import activation_grad, norm_grad
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import Channels, Quant, declare, rule

OPS = (
    declare(
        O.BATCH_NORM,
        kernel=normalization.BatchNorm,
        grad=rule("normalization", "batch_norm"),
        grad_differentiable=True,
        weights=(1, 2),
        channels=Channels.PASS,
        batch_dependent=True,
    ),
    declare(
        O.BATCH_NORM_TRAINING,
        kernel=norm_grad.BatchNormTraining,
        grad=rule("normalization", "batch_norm_training"),
        grad_differentiable=True,
        writes=(3, 4),
        batch_dependent=True,
    ),
    declare(
        O.BATCH_NORM_GRAD,
        kernel=norm_grad.BatchNormGrad,
        grad=rule("backward_norm", "batch_norm_grad"),
        grad_differentiable=True,
    ),
    declare(O.LRN, kernel=normalization.LRN),
    declare(O.INSTANCE_NORM, kernel=normalization.InstanceNorm),
    declare(
        O.LAYER_NORM,
        kernel=layer_norm.LayerNorm,
        grad=rule("normalization", "layer_norm"),
        grad_differentiable=True,
        weights=(1, 2),
    ),
    declare(
        O.LAYER_NORM_GRAD,
        kernel=norm_grad.LayerNormGrad,
        grad=rule("backward_norm", "layer_norm_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.L2_NORMALIZATION,
        kernel=l2_norm.L2Normalization,
        int8=q_l2_norm.QL2Normalization,
        int8_file_only=True,
    ),
    declare(
        O.SOFTMAX,
        kernel=softmax.Softmax,
        int8=q_softmax.QSoftmax,
        grad=rule("softmax", "softmax"),
        grad_differentiable=True,
        quant=Quant(fixed_output=(1.0 / 256, -128)),
        int16=q_int16_softmax.QSoftmax16,
    ),
    declare(
        O.LOG_SOFTMAX,
        kernel=softmax.LogSoftmax,
        int8=q_softmax.QLogSoftmax,
        int8_file_only=True,
        grad=rule("softmax", "log_softmax"),
        grad_differentiable=True,
    ),
    declare(
        O.SOFTMAX_GRAD,
        kernel=activation_grad.SoftmaxGrad,
        grad=rule("backward", "softmax_grad"),
        grad_differentiable=True,
    ),
)
