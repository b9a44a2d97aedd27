"""Quantized Softmax along one axis, exact in integers.

exp(s_in (q - max q)) depends only on the difference d = max q - q in [0, 255], so it is
a 256-entry table of fixed-point integers T[d] = round(2^24 exp(-beta s_in d)). A row's
probabilities are T[d] / sum(T) and the output q' = z_out + round(T[d] / (sum(T) s_out)).
When 1/s_out is an integer R (1/256 for TFLite's int8 softmax output), the rounding is
the integer division floor((2 R T + S) / (2 S)): the result is exact and independent of
summation order. Otherwise the quotient is formed in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec
from sporenet.lite.kernels.quantized.base import QuantizedKernel, dtype_range
from sporenet.lite.kernels.quantized.fixed_point import round_half_away
from sporenet.lite.ops import OpCode

TABLE_BITS = 24


def exp_table(scale: float, beta: float = 1.0) -> np.ndarray:
    """T[d] = round(2^24 exp(-beta * scale * d)) for d = 0..255, int64."""
    d = np.arange(256, dtype=np.float64)
    return np.floor(np.exp(-beta * scale * d) * (1 << TABLE_BITS) + 0.5).astype(np.int64)


class QSoftmax(QuantizedKernel):
    op = OpCode.SOFTMAX

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, _ = self.tensor_params(x, "the input")
        if x.rank == 0:
            raise self.fail("input must have rank >= 1")
        self.axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        oq = self.output_quant(x.dtype)
        self.so, self.zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        self.lo, self.hi = dtype_range(x.dtype)
        self.table = exp_table(sx, attrs.float("beta", 1.0))
        inverse = 1.0 / self.so
        self.ratio = round(inverse) if abs(inverse - round(inverse)) < 1e-6 * inverse else None
        reduced = list(x.shape)
        reduced[self.axis] = 1
        self.output_specs = [self.out_spec(x.shape, x.dtype, oq)]
        self.scratch_layout = [
            (x.shape, np.dtype(np.int64)),
            (tuple(reduced), x.dtype),
            (tuple(reduced), np.dtype(np.int64)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        e, peak, total = self.scratch_arrays()
        axis, table, ratio, so, zo, lo, hi = (
            self.axis,
            self.table,
            self.ratio,
            self.so,
            self.zo,
            self.lo,
            self.hi,
        )

        def compute() -> None:
            np.max(x, axis=axis, keepdims=True, out=peak)
            np.subtract(peak, x, out=e, dtype=np.int64)
            np.take(table, e, out=e)
            np.sum(e, axis=axis, keepdims=True, out=total)
            if ratio is not None:
                np.multiply(e, 2 * ratio, out=e)
                np.add(e, total, out=e)
                np.floor_divide(e, 2 * total, out=e)
                np.add(e, zo, out=e)
            else:
                q = zo + round_half_away(e / (total * so))
                np.copyto(e, q, casting="unsafe")
            np.clip(e, lo, hi, out=e)
            np.copyto(out, e, casting="unsafe")

        return compute


# tflitefix: int8 LOG_SOFTMAX on the parameters a TFLite file declares.
class QLogSoftmax(QuantizedKernel):
    """log softmax = -s_in d - log(sum exp(-s_in d)) with d = max q - q, in float64 (one
    256-entry table of exp(-s_in d)), requantized to the output's parameters (TFLite's
    16/256 and 127), ties away from zero; within one step of LiteRT's fixed point."""

    op = OpCode.LOG_SOFTMAX

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        self.sx, _ = self.tensor_params(x, "the input")
        if x.rank == 0:
            raise self.fail("input must have rank >= 1")
        self.axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        oq = self.output_quant(x.dtype)
        self.so, self.zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        self.lo, self.hi = dtype_range(x.dtype)
        self.table = np.exp(-self.sx * np.arange(256, dtype=np.float64))
        reduced = list(x.shape)
        reduced[self.axis] = 1
        self.output_specs = [self.out_spec(x.shape, x.dtype, oq)]
        self.scratch_layout = [
            (x.shape, np.dtype(np.int64)),
            (tuple(reduced), x.dtype),
            (x.shape, np.dtype(np.float64)),
            (tuple(reduced), np.dtype(np.float64)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        d, peak, real, total = self.scratch_arrays()
        axis, table, sx, so, zo = self.axis, self.table, self.sx, self.so, self.zo
        lo, hi = self.lo, self.hi

        def compute() -> None:
            np.max(x, axis=axis, keepdims=True, out=peak)
            np.subtract(peak, x, out=d, dtype=np.int64)
            np.take(table, d, out=real)
            np.sum(real, axis=axis, keepdims=True, out=total)
            np.log(total, out=total)
            np.multiply(d, -sx, out=real)
            np.subtract(real, total, out=real)
            np.divide(real, so, out=real)
            q = np.clip(round_half_away(real) + zo, lo, hi)
            np.copyto(out, q, casting="unsafe")

        return compute
