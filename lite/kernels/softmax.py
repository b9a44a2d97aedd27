"""Softmax and LogSoftmax along one axis (ONNX opset 13 semantics), numerically stable."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class _SoftmaxBase(Kernel):
    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        if x.rank == 0:
            raise self.fail("input must have rank >= 1, got a scalar")
        self.axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def _reduced(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shape = list(out.shape)
        shape[self.axis] = 1
        return np.empty(shape, out.dtype), np.empty(shape, out.dtype)


class Softmax(_SoftmaxBase):
    """exp(x - max) / sum(exp(x - max)) along `axis` (default -1)."""

    op = OpCode.SOFTMAX

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis = inputs[0], outputs[0], self.axis
        peak, total = self._reduced(out)

        def compute() -> None:
            np.max(x, axis=axis, keepdims=True, out=peak)
            np.subtract(x, peak, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=axis, keepdims=True, out=total)
            np.divide(out, total, out=out)

        return compute


class LogSoftmax(_SoftmaxBase):
    """(x - max) - log(sum(exp(x - max))) along `axis` (default -1)."""

    op = OpCode.LOG_SOFTMAX

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis = inputs[0], outputs[0], self.axis
        peak, total = self._reduced(out)

        def compute() -> None:
            np.max(x, axis=axis, keepdims=True, out=peak)
            np.subtract(x, peak, out=out)
            np.exp(out, out=out)
            np.sum(out, axis=axis, keepdims=True, out=total)
            np.log(total, out=total)
            # (x - max) - log(sum), not x - (max + log(sum)): keeps precision for big logits.
            np.subtract(x, peak, out=out)
            np.subtract(out, total, out=out)

        return compute
