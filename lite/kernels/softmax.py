"""Softmax and LogSoftmax along one axis (ONNX opset 13 semantics), numerically stable.

float16 tensors are computed in float32 and rounded once at the end: NumPy's float16
loops convert every element on every call (a reduce over a middle axis of 1x27x20 took
tens of microseconds, a large one hundreds of times float32's), and one rounding is
closer to the exact result than one per step."""

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

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        if x.dtype != np.float16:
            return self._steps(x, out)
        # Widen once, compute in float32 in place, round once into `out`.
        wide = np.empty(x.shape, np.float32)
        steps, narrow, copyto = self._steps(wide, wide), _narrow(wide, out, self.sign), np.copyto

        def compute() -> None:
            copyto(wide, x)
            steps()
            narrow()

        return compute

    # The sign of every result (probabilities >= 0, their logarithms <= 0): _narrow's.
    sign = 1.0

    def _steps(self, x: np.ndarray, out: np.ndarray) -> Compute:
        """The step writing the result for `x` into `out` (which may be `x` itself)."""
        raise NotImplementedError

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

    def _steps(self, x: np.ndarray, out: np.ndarray) -> Compute:
        axis = self.axis
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


def _narrow(wide: np.ndarray, out: np.ndarray, sign: float) -> Compute:
    """The step rounding float32 `wide` (every value of the given sign) into float16
    `out`. NumPy's cast is some 20 times slower per value landing among float16's
    subnormals (a softmax of wide-ranging logits has hundreds), and fast for a float32
    that is one already: values under float16's smallest normal are first rounded in
    float32 to multiples of its subnormal step 2**-24, as (v + c) - c with c = 0.5
    (2**-24 is the ulp of [0.5, 1)), which rounds to nearest-even as the cast does."""
    tiny, c = np.float32(np.finfo(np.float16).tiny), np.float32(0.5 * sign)
    small, rounded = np.empty(wide.shape, bool), np.empty_like(wide)
    # |v| < tiny, for values of one sign: v < tiny, or -tiny < v.
    below: np.ufunc = np.less if sign > 0 else np.greater
    nearest = np.minimum.reduce if sign > 0 else np.maximum.reduce
    bound = tiny if sign > 0 else -tiny
    add, subtract, copysign, copyto = np.add, np.subtract, np.copysign, np.copyto

    def narrow() -> None:
        if wide.size and below(nearest(wide, axis=None), bound):
            add(wide, c, out=rounded)
            subtract(rounded, c, out=rounded)
            copysign(rounded, wide, out=rounded)  # -0.0 stays -0.0
            below(wide, bound, out=small)
            copyto(wide, rounded, where=small)
        copyto(out, wide, casting="same_kind")

    return narrow


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
    sign = -1.0

    def _steps(self, x: np.ndarray, out: np.ndarray) -> Compute:
        axis = self.axis
        peak, total = self._reduced(out)
        find_peak, add_reduce = self._peak(x, peak), np.add.reduce
        # exp(x - max) is summed from `spare`, so `out` may be `x` itself (float16).
        spare = np.empty(x.shape, x.dtype) if out is x else out

        def compute() -> None:
            find_peak()
            np.subtract(x, peak, out=spare)
            np.exp(spare, out=spare)
            add_reduce(spare, axis=axis, keepdims=True, out=total)  # np.sum's reduce
            np.log(total, out=total)
            # (x - max) - log(sum), not x - (max + log(sum)): keeps precision for big logits.
            np.subtract(x, peak, out=out)
            np.subtract(out, total, out=out)

        return compute
