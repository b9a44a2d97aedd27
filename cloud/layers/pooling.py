"""MaxPool2d, AvgPool2d and GlobalAvgPool over NCHW input."""

from __future__ import annotations

from typing import Any

from sporenet.cloud._checks import pair
from sporenet.cloud.module import Module
from sporenet.cloud.tape import Var
from sporenet.lite.ops import OpCode


class _Pool2d(Module):
    op: OpCode

    def __init__(self, kernel_size: Any, *, stride: Any = None, padding: Any = 0) -> None:
        super().__init__()
        self.kernel_size = pair("kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else pair("stride", stride)
        ph, pw = pair("padding", padding, minimum=0)
        self.pads = [ph, pw, ph, pw]

    def attrs(self) -> dict[str, Any]:
        return {
            "kernel_shape": list(self.kernel_size),
            "strides": list(self.stride),
            "pads": list(self.pads),
        }

    def forward(self, x: Var) -> Var:
        return x.tape.op(self.op, [x], **self.attrs())

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"


class MaxPool2d(_Pool2d):
    """Maximum over windows (padding never wins the max)."""

    op = OpCode.MAX_POOL2D


class AvgPool2d(_Pool2d):
    """Mean over windows; padded positions are not counted (count_include_pad=0)."""

    op = OpCode.AVG_POOL2D


class GlobalAvgPool(Module):
    """Mean over H and W: (N, C, H, W) -> (N, C), or (N, C, 1, 1) with keepdims."""

    def __init__(self, *, keepdims: bool = False) -> None:
        super().__init__()
        self.keepdims = bool(keepdims)

    def forward(self, x: Var) -> Var:
        y = x.tape.op(OpCode.GLOBAL_AVG_POOL, [x])
        return y if self.keepdims else y.flatten(1)
