"""int16 Softmax as TFLite's reference kernel computes it: two interpolated 513-entry
tables, exp(x) on [-10, 0] and 1 / (1 + x) on [0, 1], both in Q0.15.

Per row: d = q - max q is rescaled by s_in beta / (10 / 65535)
(MultiplyByQuantizedMultiplier) so that [-65535, 0] spans [-10, 0], recentred by
+32767 and saturated to int16, and looked up in the exp table. The sum S of the row's
exps (Q16.15) is normalized by its leading zeros c into [1, 2) (Q2.14 after a rounding
shift), recentred, and looked up in the reciprocal table; each output is
(e * 1/S + 2^(30 - c)) >> (31 - c), clamped to [0, 32767] (scale 2^-15, zero point 0).

The tables and their lookup are int16_lut.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.kernels.quantized.int16_lut import F32, RANGE, int16_table, lookup
from sporenet.lite.kernels.quantized.int16_sigmoid import checked_log2
from sporenet.lite.ops import OpCode

EXP_TABLE = int16_table(np.exp, F32(10.0) / RANGE, 32767, F32(2.0) / RANGE)
RECIPROCAL_TABLE = int16_table(
    lambda v: F32(1) / (F32(1) + v), F32(1.0) / RANGE, -32768, F32(2.0) / RANGE
)


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
        oq, so, zo = self.declared_output(x.dtype)
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
