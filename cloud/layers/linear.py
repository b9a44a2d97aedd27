"""Dense: a fully connected layer (FULLY_CONNECTED, weights (out, in) + bias)."""

from __future__ import annotations

from sporenet.cloud._checks import positive_int
from sporenet.cloud.init import bias_uniform, he_uniform
from sporenet.cloud.module import Module, Parameter
from sporenet.cloud.tape import Var
from sporenet.lite.ops import OpCode


class Dense(Module):
    """y = x @ W.T + b over the last axis."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True) -> None:
        super().__init__()
        self.in_features = positive_int("in_features", in_features)
        self.out_features = positive_int("out_features", out_features)
        self.weight = Parameter(he_uniform((out_features, in_features), in_features))
        self.bias = Parameter(bias_uniform((out_features,), in_features)) if bias else None

    def forward(self, x: Var) -> Var:
        t = x.tape
        inputs = [x, t.param(self.weight)]
        if self.bias is not None:
            inputs.append(t.param(self.bias))
        return t.op(OpCode.FULLY_CONNECTED, inputs)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"
