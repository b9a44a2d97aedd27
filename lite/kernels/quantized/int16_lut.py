"""int16 interpolated lookup tables as TFLite builds them (LUTPopulate for int16), and
the unary ops LiteRT runs through them on int16: EXP, LOG, RSQRT and GELU.

A table has 513 entries over the int16 input range: 512 samples f(x_i) of the
dequantized inputs, each moved by half the rounded error of the chord at the step's
midpoint, and f(x_max) last, all in float32 and scaled to the output's int16 units. A
lookup at v: base = T[256 + (v >> 7)], plus the slope to the next entry times the 7 low
bits of v, rounded ((slope * (v & 127) + 64) >> 7).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.activation import _params
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import round_half_away
from sporenet.lite.ops import OpCode

F32 = np.float32
RANGE = F32(65535)  # int16 max - min


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
    # a result that is not a number (LOG or RSQRT below 0) maps to the lowest integer
    return np.clip(np.nan_to_num(table, nan=-32768.0), -32768, 32767).astype(np.int64)


def lookup(v: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The interpolated table value at the int16 values `v` (int64 arrays)."""
    index = 256 + (v >> 7)
    base = table[index]
    return base + (((table[index + 1] - base) * (v & 0x7F) + 64) >> 7)


class _QLut16(QuantizedKernel):
    """A unary int16 op as one interpolated table lookup, table built at prepare time."""

    accepts = INT16_DTYPES
    function: Callable[[np.ndarray], np.ndarray]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        _, sx, zx, so, zo = _params(self)
        if zo != 0:
            raise self.fail(f"an int16 output must have zero point 0, got {zo}")
        table = int16_table(type(self).function, F32(sx), zx, F32(so))
        q = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
        self.table = lookup(q.astype(np.int64), table).astype(np.int16)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        index, out, table = required(inputs, 0).view(np.uint16), outputs[0], self.table

        def step() -> None:
            # Every value of the index dtype is in the table: mode="clip" skips the
            # default mode's bounds check, which copies through a buffer on every call.
            table.take(index, out=out, mode="clip")

        return step


def _with_errors_ignored(
    f: Callable[[np.ndarray], np.ndarray],
) -> Callable[[np.ndarray], np.ndarray]:
    def guarded(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return np.asarray(f(x), F32)

    return guarded


_erf = np.vectorize(math.erf, otypes=[np.float64])


class QExp16(_QLut16):
    op = OpCode.EXP
    function = staticmethod(_with_errors_ignored(np.exp))


class QLog16(_QLut16):
    op = OpCode.LOG
    function = staticmethod(_with_errors_ignored(np.log))


class QRsqrt16(_QLut16):
    op = OpCode.RSQRT
    function = staticmethod(_with_errors_ignored(lambda x: F32(1) / np.sqrt(x)))


class QGelu16(_QLut16):
    op = OpCode.GELU
    function = staticmethod(
        _with_errors_ignored(lambda x: x * F32(0.5) * (F32(1) + _erf(x / np.sqrt(2.0)).astype(F32)))
    )
