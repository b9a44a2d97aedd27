"""int16 Logistic and Tanh as TFLite's reference kernels compute them: linear
interpolation in one 256-entry table of sigmoid(i / 24) in 0.16 fixed point, using
tanh(x) = 2 sigmoid(2x) - 1.

The table: each entry is sigmoid(i / 24) moved by half the gap between the function and
the chord at the interval's midpoint (the correction that halves the interpolation's
worst error), times 2^16, rounded; the last is 2^16 - 1, the saturated value.

The input is rescaled to units of 1 / (3 * 4096) (Q3.12 times 3/4, so the table's
[0, 10.7) spans the interpolation's 2^17 steps): a power-of-two scale of 2^-12 (or
2^-11 for Tanh) by the integer 3 << shift, any other by the multiplier
int(s_in * 3 * 4096 * 2^k) with the smallest k that takes it above 2^14 - 1/2, then a
rounding shift right by k. Both ops need zero points 0 and the output scale 2^-15
(LiteRT refuses other parameters). The whole map is evaluated over all 65536 inputs
once, at prepare time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.activation import _params
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.ops import OpCode


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def sigmoid_table() -> np.ndarray:
    """The 256 entries of sigmoid(i / 24) in 0.16 fixed point, midpoint-corrected."""
    i = np.arange(256, dtype=np.float64)
    here, after, middle = _sigmoid(i / 24), _sigmoid((i + 1) / 24), _sigmoid((i + 0.5) / 24)
    corrected = here + (middle - (here + after) / 2) / 2
    table = np.minimum(np.round(corrected * 65536), 65535).astype(np.int64)
    table[-1] = 65535
    return table


_TABLE = sigmoid_table()


def checked_log2(x: float) -> int | None:
    """log2(x) when x is a power of two to within TFLite's tolerance (CheckedLog2, in
    float32: a fractional part below 1e-3), else None."""
    log2 = np.float32(math.log(np.float32(x))) * np.float32(1.0 / math.log(2.0))
    rounded = np.round(log2)
    return int(rounded) if abs(float(log2 - rounded)) < 1e-3 else None


def input_rescale(scale: float, pot_shifts: tuple[int, ...]) -> tuple[int, int]:
    """(multiplier, right shift) taking q to units of 1 / (3 * 4096)."""
    log2 = checked_log2(scale)
    if log2 is not None and 12 + log2 in pot_shifts:
        return 3 << (12 + log2), 0
    multiplier, shift = scale * 4096.0 * 3.0, 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    return int(multiplier), shift


def _interpolate(x: np.ndarray, fraction_bits: int, saturated: int) -> np.ndarray:
    """The table interpolated at |x| (x in 2^-fraction_bits table steps), in 0.(16 +
    fraction_bits) fixed point; `saturated` past the table."""
    a = np.abs(x)
    step = a >> fraction_bits
    inside = np.minimum(step, 254)
    low, high = _TABLE[inside], _TABLE[inside + 1]
    value = (low << fraction_bits) + (a & ((1 << fraction_bits) - 1)) * (high - low)
    return np.where(step >= 255, saturated, value)


def logistic16(q: np.ndarray, scale: float) -> np.ndarray:
    """TFLite's int16 Logistic of the int64 inputs `q` (zero point 0)."""
    multiplier, shift = input_rescale(scale, (0,))
    half = (1 << (shift - 1)) if shift > 0 else 0
    x = (q * multiplier + half) >> shift
    value = _interpolate(x, 9, 0x7FFF << 10)
    value = np.where(x >= 0, value + (1 << 9), (1 << 25) - value + (1 << 9) - 1)
    return value >> 10


def tanh16(q: np.ndarray, scale: float) -> np.ndarray:
    """TFLite's int16 Tanh of the int64 inputs `q` (zero point 0)."""
    multiplier, shift = input_rescale(scale, (0, 1))
    half = (1 << (shift - 1)) if shift > 0 else 0
    x = (q * multiplier + half) >> shift
    value = _interpolate(x, 8, 0xFFFF << 8)
    value = np.where(x >= 0, value - (1 << 23) + (1 << 7), -value + (1 << 23) + (1 << 7) - 1)
    return value >> 8


class _QSigmoidFamily(QuantizedKernel):
    accepts = INT16_DTYPES

    @staticmethod
    def evaluate(q: np.ndarray, scale: float) -> np.ndarray:
        raise NotImplementedError

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        _, sx, zx, so, zo = _params(self)
        if zx != 0 or zo != 0:
            raise self.fail(f"int16 zero points must be 0, got input {zx} and output {zo}")
        if checked_log2(so) != -15:
            raise self.fail(f"the int16 output scale must be 2^-15, got {so}")
        q = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
        values = type(self).evaluate(q.astype(np.int64), sx)
        self.table = np.clip(values, -32768, 32767).astype(np.int16)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        index, out, table = required(inputs, 0).view(np.uint16), outputs[0], self.table

        def step() -> None:
            # Every value of the index dtype is in the table: mode="clip" skips the
            # default mode's bounds check, which copies through a buffer on every call.
            table.take(index, out=out, mode="clip")

        return step


class QLogistic16(_QSigmoidFamily):
    op = OpCode.SIGMOID
    evaluate = staticmethod(logistic16)


class QTanh16(_QSigmoidFamily):
    op = OpCode.TANH
    evaluate = staticmethod(tanh16)
