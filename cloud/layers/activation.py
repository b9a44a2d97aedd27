"""Activation layers, one op each."""

from __future__ import annotations

from typing import Any, ClassVar

from sporenet.cloud._checks import choice, number
from sporenet.cloud.module import Module
from sporenet.cloud.tape import Var
from sporenet.lite.ops import OpCode


class _Activation(Module):
    op: ClassVar[OpCode]

    def attrs(self) -> dict[str, Any]:
        return {}

    def forward(self, x: Var) -> Var:
        return x.tape.op(self.op, [x], **self.attrs())


class ReLU(_Activation):
    op = OpCode.RELU


class ReLU6(_Activation):
    op = OpCode.RELU6


class Sigmoid(_Activation):
    op = OpCode.SIGMOID


class Tanh(_Activation):
    op = OpCode.TANH


class HardSwish(_Activation):
    op = OpCode.HARD_SWISH


class SiLU(_Activation):
    """x * sigmoid(x) (Swish with beta 1)."""

    op = OpCode.SILU


class LeakyReLU(_Activation):
    """max(x, alpha * x)."""

    op = OpCode.LEAKY_RELU

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        self.alpha = number("alpha", alpha, low=0.0)

    def attrs(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class GELU(_Activation):
    """x * Phi(x); `approximate="tanh"` uses the tanh formula."""

    op = OpCode.GELU

    def __init__(self, *, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = choice("approximate", approximate, ["none", "tanh"])

    def attrs(self) -> dict[str, Any]:
        return {"approximate": self.approximate}
