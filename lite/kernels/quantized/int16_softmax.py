"""int16 Softmax as TFLite's reference kernel computes it: two interpolated 513-entry
tables, exp(x) on [-10, 0] and 1 / (1 + x) on [0, 1], both in Q0.15.

Per row: d = q - max q is rescaled by s_in beta / (10 / 65535)
(MultiplyByQuantizedMultiplier) so that [-65535, 0] spans [-10, 0], recentred by
+32767 and saturated to int16, and looked up in the exp table. The sum S of the row's
exps (Q16.15) is normalized by its leading zeros c into [1, 2) (Q2.14 after a rounding
shift), recentred, and looked up in the reciprocal table; each output is
(e * 1/S + 2^(30 - c)) >> (31 - c), clamped to [0, 32767] (scale 2^-15, zero point 0).

A table lookup at v (int16): base = T[256 + (v >> 7)], plus the slope to the next entry
times the 7 low bits of v, rounded ((slope * (v & 127) + 64) >> 7). The tables are built
as TFLite's LUTPopulate builds them, in float32: 512 samples f(x_i), each moved by half
the rounded error of the chord at the step's midpoint, and f(x_max) last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer, round_half_away
from sporenet.lite.kernels.quantized.int16_sigmoid import checked_log2
from sporenet.lite.ops import OpCode

F32 = np.float32
_RANGE = F32(65535)  # int16 max - min


def int16_table(
    f: Callable[[np.ndarray], np.ndarray], in_scale: F32, in_zero: int, out_scale: F32
) -> np.ndarray:
    """513 int64 entries of f over the int16 input range at (in_scale, in_zero), output
    at (out_scale, 0) in float32 arithmetic, as TFLite's LUTPopulate for int16."""
    lo, hi = in_scale * F32(-32768 - in_zero), in_scale * F32(32767 - in_zero)
    out_lo, out_hi = out_scale * F32(-32768), out_scale * F32(32767)
    step = (hi - lo) / F32(512)
    inverse = F32(65536) / (out_hi - out_lo)
    i = np.arange(512).astype(F32)

    def rounded(v: np.ndarray) -> np.ndarray:
        return round_half_away(np.asarray(v, np.float64)).astype(F32)

    value = f(lo + i * step)
    middle = f(lo + i * step + step / F32(2))
    after = f(lo + (i + F32(1)) * step)
    sample = rounded(value * inverse)
    chord = rounded((after * inverse + sample) / F32(2))
    bias = rounded((chord - rounded(middle * inverse)) / F32(2))
    table = np.append(sample - bias, rounded(f(np.asarray([hi], F32)) * inverse))
    return np.clip(table, -32768, 32767).astype(np.int64)


EXP_TABLE = int16_table(np.exp, F32(10.0) / _RANGE, 32767, F32(2.0) / _RANGE)
RECIPROCAL_TABLE = int16_table(
    lambda v: F32(1) / (F32(1) + v), F32(1.0) / _RANGE, -32768, F32(2.0) / _RANGE
)


def lookup(v: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The interpolated table value at the int16 values `v` (int64 arrays)."""
    index = 256 + (v >> 7)
    base = table[index]
    return base + (((table[index + 1] - base) * (v & 0x7F) + 64) >> 7)


class QSoftmax16(QuantizedKernel):
    op = OpCode.SOFTMAX
    accepts = INT16_DTYPES

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, _ = self.tensor_params(x, "the input")
        if x.rank == 0:
            raise self.fail("input must have rank >= 1")
        self.axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        oq = self.output_quant(x.dtype)
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        if zo != 0 or checked_log2(so) != -15:
            raise self.fail(
                f"the int16 output must have scale 2^-15 and zero point 0, got {so}, {zo}"
            )
        beta = attrs.float("beta", 1.0)
        self.rescale = Requantizer(sx * beta / (10.0 / 65535.0), 0, -(1 << 40), 1 << 40)
        self.output_specs = [self.out_spec(x.shape, x.dtype, oq)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis, rescale = required(inputs, 0), outputs[0], self.axis, self.rescale

        def compute() -> None:
            d = x.astype(np.int64)
            d -= np.max(d, axis=axis, keepdims=True)
            rescale.multiply(d)
            d += 32767
            np.clip(d, -32768, 32767, out=d)
            e = lookup(d, EXP_TABLE)
            total = np.sum(e, axis=axis, keepdims=True)
            zeros = 32 - np.frexp(total.astype(np.float64))[1].astype(np.int64)
            shifted = ((total << (zeros - 1)) + (1 << 13)) >> 14
            centred = np.clip(shifted - ((1 << 15) + (1 << 16)), -32768, 32767)
            right = 31 - zeros
            result = (e * lookup(centred, RECIPROCAL_TABLE) + (1 << (right - 1))) >> right
            np.clip(result, 0, 32767, out=result)
            np.copyto(out, result, casting="unsafe")

        return compute
