"""BatchNorm2d: batch statistics while training (running averages updated), running ones
in eval mode and in exported models."""

from __future__ import annotations

import numpy as np

from sporenet.cloud._checks import number, positive_int
from sporenet.cloud.module import Buffer, Module, Parameter
from sporenet.cloud.tape import Tape, Var
from sporenet.lite.ops import OpCode


class BatchNorm2d(Module):
    """Per-channel normalization of NCHW input with learned scale and shift.

    `momentum` weighs the new batch statistic in the running average, as in PyTorch:
    running = (1 - momentum) * running + momentum * batch.
    """

    def __init__(self, num_features: int, *, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.num_features = positive_int("num_features", num_features)
        self.eps = number("eps", eps, low=0.0, low_open=True)
        self.momentum = number("momentum", momentum, low=0.0, high=1.0)
        self.weight = Parameter(np.ones(num_features, np.float32))
        self.bias = Parameter(np.zeros(num_features, np.float32))
        self.running_mean = Buffer(np.zeros(num_features, np.float32))
        self.running_var = Buffer(np.ones(num_features, np.float32))

    def forward(self, x: Var) -> Var:
        t = x.tape
        inputs = [
            x,
            t.param(self.weight),
            t.param(self.bias),
            t.param(self.running_mean),
            t.param(self.running_var),
        ]
        if not self.training:
            # momentum rides along so lite's make_training_model can switch this node to
            # training mode in graph mode; inference ignores it.
            return t.op(OpCode.BATCH_NORM, inputs, epsilon=self.eps, momentum=self.momentum)
        return batch_norm_train(t, inputs, self)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


def batch_norm_train(t: Tape, inputs: list[Var], layer: BatchNorm2d) -> Var:
    """Training-mode BatchNorm: normalizes with the batch statistics and updates the running
    averages (inputs 3 and 4) in place, so the layer's buffers follow the training."""
    y, _mean, _invstd = t.op(
        OpCode.BATCH_NORM_TRAINING,
        inputs,
        num_outputs=3,
        epsilon=layer.eps,
        momentum=layer.momentum,
    )
    return y
