"""Training ops: dropout, losses, backward kernels of their own, optimizer updates, state."""

from __future__ import annotations

from sporenet.lite.kernels import state
from sporenet.lite.kernels.quantized import shape as q_shape
from sporenet.lite.kernels.training import (
    activation_grad,
    dropout,
    losses,
    matmul,
    optimizers,
    shape_grad,
)
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import Channels, declare, rule

OPS = (
    declare(
        O.DROPOUT,
        kernel=dropout.Dropout,
        grad=rule("dropout", "dropout"),
        grad_differentiable=True,
        channels=Channels.PASS,
        writes=(1,),  # its random step counter
        batch_dependent=True,
    ),
    # losses
    declare(
        O.SOFTMAX_CROSS_ENTROPY,
        kernel=losses.SoftmaxCrossEntropy,
        grad=rule("losses", "softmax_cross_entropy"),
        grad_differentiable=True,
    ),
    declare(
        O.SOFTMAX_CROSS_ENTROPY_GRAD,
        kernel=losses.SoftmaxCrossEntropyGrad,
        grad=rule("backward", "softmax_cross_entropy_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.MSE_LOSS, kernel=losses.MSELoss, grad=rule("losses", "mse_loss"), grad_differentiable=True
    ),
    declare(
        O.MSE_LOSS_GRAD,
        kernel=losses.MSELossGrad,
        grad=rule("backward", "mse_loss_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.BCE_WITH_LOGITS,
        kernel=losses.BCEWithLogits,
        grad=rule("losses", "bce_with_logits"),
        grad_differentiable=True,
    ),
    declare(
        O.BCE_WITH_LOGITS_GRAD,
        kernel=losses.BCEWithLogitsGrad,
        grad=rule("backward", "bce_with_logits_grad"),
        grad_differentiable=True,
    ),
    # backward kernels that are not some op's forward
    declare(
        O.MATMUL_TRANSPOSED,
        kernel=matmul.MatMulTransposed,
        grad=rule("backward", "matmul_transposed"),
        grad_differentiable=True,
    ),
    declare(
        O.ACTIVATION_GRAD,
        kernel=activation_grad.ActivationGrad,
        grad=rule("backward", "activation_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.SLICE_GRAD,
        kernel=shape_grad.SliceGrad,
        grad=rule("backward", "slice_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.PAD_GRAD,
        kernel=shape_grad.PadGrad,
        grad=rule("backward", "pad_grad"),
        grad_differentiable=True,
    ),
    declare(
        O.GATHER_GRAD,
        kernel=shape_grad.GatherGrad,
        grad=rule("backward", "gather_grad"),
        grad_differentiable=True,
    ),
    # optimizer updates and variables (written in place, kept between runs)
    declare(O.SGD_UPDATE, kernel=optimizers.SGDUpdate, writes=(0, 3)),
    declare(O.ADAM_UPDATE, kernel=optimizers.AdamUpdate, writes=(0, 3, 4, 5)),
    # TFLite resource variables: int8 values are read and written as stored, as TFLite does
    declare(
        O.ASSIGN,
        kernel=optimizers.Assign,
        int8=optimizers.Assign,
        int8_file_only=True,
        writes=(0,),
        int16=optimizers.Assign,
    ),
    declare(
        O.READ_VARIABLE,
        kernel=state.ReadVariable,
        int8=q_shape.QReadVariable,
        int8_file_only=True,
        int16=q_shape.QReadVariable,
    ),
)
