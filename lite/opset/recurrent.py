"""Recurrent layers over a whole sequence, and their backward kernels."""

from __future__ import annotations

from sporenet.lite.kernels import recurrent, sequence_lstm
from sporenet.lite.kernels.training import recurrent_grad
from sporenet.lite.ops import OpCode as O
from sporenet.lite.opset.decl import declare, rule

_RNN = {
    "grad": rule("recurrent", "recurrent"),
    "grad_differentiable": True,
    "float16_widened": True,
}
# the backward ops' own rule: the vjp of the layer rebuilt from differentiable ops
_SECOND = {"grad": rule("recurrent_graph", "backward_grad"), "grad_differentiable": True}

OPS = (
    declare(O.LSTM, kernel=recurrent.LSTM, weights=(1, 2, 3, 7), **_RNN),  # W, R, B, peepholes
    declare(O.GRU, kernel=recurrent.GRU, weights=(1, 2, 3), **_RNN),
    declare(O.RNN, kernel=recurrent.RNN, weights=(1, 2, 3), **_RNN),
    # TFLite's LSTM step: CIFG, peepholes, layer norm, projection, clipping, reverse
    declare(O.SEQUENCE_LSTM, kernel=sequence_lstm.SequenceLSTM),
    # an LSTM of a training graph, saving its steps for LSTM_GRAD
    declare(
        O.LSTM_TRAINING,
        kernel=recurrent_grad.LSTMTraining,
        grad=rule("recurrent", "lstm_training"),
        grad_differentiable=True,
    ),
    declare(O.LSTM_GRAD, kernel=recurrent_grad.LSTMGrad, **_SECOND),
    declare(O.GRU_GRAD, kernel=recurrent_grad.GRUGrad, **_SECOND),
    declare(O.RNN_GRAD, kernel=recurrent_grad.RNNGrad, **_SECOND),
)
