"""Unary elementwise kernels and activations: Relu, Sigmoid, Tanh, ..."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class UnaryKernel(Kernel):
    """out = f(x), same shape and dtype; subclasses define `compute(x, out)`."""

    float_only: ClassVar[bool] = True

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0) if self.float_only else self.input(0)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, f = inputs[0], outputs[0], self.compute
        return lambda: f(x, out)


class Relu(UnaryKernel):
    op = OpCode.RELU

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        np.maximum(x, 0, out=out)


class Sigmoid(UnaryKernel):
    op = OpCode.SIGMOID

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        # 1 / (1 + exp(-x)), computed in place in `out`.
        np.negative(x, out=out)
        np.exp(out, out=out)
        out += 1
        np.reciprocal(out, out=out)


class Tanh(UnaryKernel):
    op = OpCode.TANH

    def compute(self, x: np.ndarray, out: np.ndarray) -> None:
        np.tanh(x, out=out)
