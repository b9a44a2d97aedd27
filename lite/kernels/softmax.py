"""Softmax and LogSoftmax along one axis (ONNX opset 13 semantics), numerically stable."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.reduce import short_last_axis, slice_by_slice
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

    def _peak(self, x: np.ndarray, peak: np.ndarray) -> Compute:
        """The step peak = max(x) along the axis: the ufunc's reduce without np.max's
        Python wrapper, or slice by slice over a short last axis (reduce.py says why);
        the same values either way."""
        if short_last_axis(x.shape, (self.axis,)):
            return slice_by_slice(np.maximum, x, peak)
        reduce, axis = np.maximum.reduce, self.axis
        return lambda: reduce(x, axis=axis, keepdims=True, out=peak)


class Softmax(_SoftmaxBase):
    """exp(x - max) / sum(exp(x - max)) along `axis` (default -1).

    Probabilities below the smallest normal float are written as zero, as onnxruntime's
    and LiteRT's exp kernels do: a subnormal reaching a product downstream (an attention
    MatMul, then a fully connected layer) makes it an order of magnitude slower, and no
    value moves by more than 2e-31 (float32; _flush_subnormals says how)."""

    op = OpCode.SOFTMAX

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis = required(inputs, 0), outputs[0], self.axis
        peak, total = self._reduced(out)
        find_peak, add_reduce = self._peak(x, peak), np.add.reduce
        flush = _flush_subnormals(out)

        def compute() -> None:
            find_peak()
            np.subtract(x, peak, out=out)
            np.exp(out, out=out)
            add_reduce(out, axis=axis, keepdims=True, out=total)  # np.sum without its wrapper
            np.divide(out, total, out=out)
            flush()

        return compute


def _flush_subnormals(out: np.ndarray) -> Compute:
    """The step that zeroes the subnormal values of `out` (probabilities, in [0, 1]): one
    min pass, and only when a value is below the smallest normal, (out + c) - c with c's
    ulp that smallest normal (float32: c = 2**-103). Values under the smallest normal
    become 0 or it; others below 2**-78 move by at most an ulp of their sum with c
    (under 2e-31); larger ones stay exact. float16 is left as it is: NumPy computes it
    in float32, where its subnormals are normal."""
    if out.dtype not in (np.float32, np.float64) or not out.size:
        return lambda: None
    info = np.finfo(out.dtype)
    tiny, c = info.tiny, out.dtype.type(info.tiny * 2.0 ** (info.nmant))
    lowest, add, subtract = np.minimum.reduce, np.add, np.subtract

    def flush() -> None:
        if lowest(out, axis=None) < tiny:
            add(out, c, out=out)
            subtract(out, c, out=out)

    return flush


class LogSoftmax(_SoftmaxBase):
    """(x - max) - log(sum(exp(x - max))) along `axis` (default -1)."""

    op = OpCode.LOG_SOFTMAX

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis = required(inputs, 0), outputs[0], self.axis
        peak, total = self._reduced(out)
        find_peak, add_reduce = self._peak(x, peak), np.add.reduce

        def compute() -> None:
            find_peak()
            np.subtract(x, peak, out=out)
            np.exp(out, out=out)
            add_reduce(out, axis=axis, keepdims=True, out=total)  # np.sum without its wrapper
            np.log(total, out=total)
            # (x - max) - log(sum), not x - (max + log(sum)): keeps precision for big logits.
            np.subtract(x, peak, out=out)
            np.subtract(out, total, out=out)

        return compute
