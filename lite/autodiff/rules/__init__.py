"""The gradient-rule table: one explicit entry per differentiable op code.

Rules live in modules named after their forward kernels' modules (rules/linear.py for
lite/kernels/linear.py, ...). Ops built from differentiable primitives need no rule.
"""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradRule
from sporenet.lite.autodiff.rules import (
    control_flow,
    conv,
    dropout,
    elementwise,
    fake_quant,
    linear,
    losses,
    normalization,
    pooling,
    recurrent,
    reshape,
    softmax,
    transform,
    unary,
)
from sporenet.lite.ops import OpCode

GRADIENT_RULES: dict[OpCode, GradRule] = {
    # structural
    OpCode.IDENTITY: reshape.identity,
    OpCode.RESHAPE: reshape.reshape,
    OpCode.FLATTEN: reshape.reshape,
    OpCode.SQUEEZE: transform.squeeze,
    OpCode.UNSQUEEZE: transform.squeeze,
    OpCode.TRANSPOSE: transform.transpose,
    OpCode.CONCAT: transform.concat,
    OpCode.SPLIT: transform.split,
    OpCode.SLICE: transform.slice_,
    OpCode.GATHER: transform.gather,
    OpCode.PAD: transform.pad,
    OpCode.EXPAND: transform.expand,
    # linear algebra
    OpCode.FULLY_CONNECTED: linear.fully_connected,
    OpCode.MATMUL: linear.matmul,
    OpCode.CONV2D: conv.conv2d,
    # binary elementwise
    OpCode.ADD: elementwise.add,
    OpCode.SUB: elementwise.sub,
    OpCode.MUL: elementwise.mul,
    OpCode.DIV: elementwise.div,
    OpCode.MAXIMUM: elementwise.maximum,
    OpCode.MINIMUM: elementwise.minimum,
    # unary and activations
    OpCode.RELU: unary.relu,
    OpCode.RELU6: unary.relu6,
    OpCode.CLIP: unary.clip,
    OpCode.LEAKY_RELU: unary.leaky_relu,
    OpCode.PRELU: unary.prelu,
    OpCode.SIGMOID: unary.sigmoid,
    OpCode.TANH: unary.tanh,
    OpCode.HARD_SWISH: unary.hard_swish,
    OpCode.SILU: unary.silu,
    OpCode.HARD_SIGMOID: unary.hard_sigmoid,
    OpCode.GELU: unary.gelu,
    OpCode.ELU: unary.elu,
    OpCode.SOFTPLUS: unary.softplus,
    OpCode.ABS: unary.abs_,
    OpCode.NEG: unary.neg,
    OpCode.EXP: unary.exp,
    OpCode.LOG: unary.log,
    OpCode.SQRT: unary.sqrt,
    OpCode.SQUARE: unary.square,
    OpCode.RECIPROCAL: unary.reciprocal,
    # quantization-aware training
    OpCode.FAKE_QUANT: fake_quant.fake_quant,
    # normalization and softmax
    OpCode.SOFTMAX: softmax.softmax,
    OpCode.LOG_SOFTMAX: softmax.log_softmax,
    OpCode.BATCH_NORM: normalization.batch_norm,
    OpCode.LAYER_NORM: normalization.layer_norm,
    # pooling
    OpCode.MAX_POOL2D: pooling.max_pool2d,
    OpCode.AVG_POOL2D: pooling.avg_pool2d,
    OpCode.GLOBAL_AVG_POOL: pooling.global_avg_pool,
    OpCode.GLOBAL_MAX_POOL: pooling.global_max_pool,
    # reductions
    OpCode.REDUCE_SUM: transform.reduce_sum,
    OpCode.REDUCE_MEAN: transform.reduce_mean,
    # recurrent layers
    OpCode.LSTM: recurrent.recurrent,
    OpCode.GRU: recurrent.recurrent,
    OpCode.RNN: recurrent.recurrent,
    # training
    OpCode.BATCH_NORM_TRAINING: normalization.batch_norm_training,
    OpCode.DROPOUT: dropout.dropout,
    OpCode.SOFTMAX_CROSS_ENTROPY: losses.softmax_cross_entropy,
    OpCode.MSE_LOSS: losses.mse_loss,
    OpCode.BCE_WITH_LOGITS: losses.bce_with_logits,
    # subgraph ops: custom gradients and control flow (autodiff)
    OpCode.CALL: control_flow.call,
    OpCode.IF: control_flow.if_,
    OpCode.LOOP: control_flow.loop,
}
