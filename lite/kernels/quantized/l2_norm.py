"""int8 L2_NORMALIZATION with TFLite's integer semantics (reference_integer_ops):
acc = sum of (q - z_in)^2 along the axis; TFLite's fixed-point inverse square root of acc
(GetInvSqrtQuantizedMultiplierExp: five Newton-Raphson steps in gemmlowp's Q3.28) as a
multiplier and shift; out = clamp(MultiplyByQuantizedMultiplier(q - z_in, M, shift + 7)),
the output quantized with scale 1/128 and zero point 0, as TFLite requires.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.ops import OpCode

_MIN, _MAX = -(1 << 31), (1 << 31) - 1


def _high_mul(a: int, b: int) -> int:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32 values."""
    if a == b == _MIN:
        return _MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    total = ab + nudge
    return total // (1 << 31) if total >= 0 else -((-total) // (1 << 31))  # C truncation


def _times_pot(x: int, exponent: int) -> int:
    """gemmlowp's SaturatingRoundingMultiplyByPOT."""
    if exponent > 0:
        return max(_MIN, min(_MAX, x << exponent))
    if exponent == 0:
        return x
    shift = -exponent
    mask = (1 << shift) - 1
    remainder, threshold = x & mask, (mask >> 1) + (1 if x < 0 else 0)
    return (x >> shift) + (1 if remainder > threshold else 0)


def _wrap(x: int) -> int:
    return (x + (1 << 31)) % (1 << 32) - (1 << 31)


def inv_sqrt_multiplier(value: int) -> tuple[int, int]:
    """TFLite's GetInvSqrtQuantizedMultiplierExp(value, reverse_shift=-1): (M, shift) with
    1 / sqrt(value) ~= M * 2^(shift - 31)."""
    if value <= 1:
        return _MAX, 0
    shift = 11
    while value >= 1 << 29:
        value //= 4
        shift += 1
    leading = 32 - value.bit_length()  # CountLeadingZeros of the uint32
    pairs = (leading - 1) // 2 - 1
    shift -= pairs
    value <<= 2 * pairs
    one = 1 << 28  # F3's 1.0
    half_input = _times_pot(value >> 1, -1)
    half_three = (1 << 28) + (1 << 27)
    x = one
    for _ in range(5):
        x3 = _times_pot(_high_mul(_high_mul(x, x), x), 6)  # F9 -> F3
        step = _wrap(_high_mul(half_three, x) - _high_mul(half_input, x3))  # F6
        x = _times_pot(step, 3)  # F6 -> F3
    x = _high_mul(x, 1518500250)  # times sqrt(2) / 2 in Q0.31
    if shift < 0:
        x <<= -shift
        shift = 0
    return x, -shift


def _mbqm(x: np.ndarray, m: int, shift: int) -> np.ndarray:
    """MultiplyByQuantizedMultiplier on int64 arrays of int32 values."""
    left, right = max(shift, 0), max(-shift, 0)
    p = (x << left) * m
    high = np.where(p >= 0, (p + (1 << 30)) >> 31, -((-p + (1 << 30) - 1) >> 31))
    if right:
        high = (high + (1 << (right - 1)) - (high < 0)) >> right
    return high


class QL2Normalization(QuantizedKernel):
    op = OpCode.L2_NORMALIZATION

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        if x.dtype != np.int8:
            raise self.fail(f"the integer form takes int8, got {x.dtype}")
        _, self.zx = self.tensor_params(x, "the input")
        oq = self.output_quant(x.dtype)
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        if so != 1 / 128 or zo != 0:
            raise self.fail(f"the output must have scale 1/128 and zero point 0, got {so}, {zo}")
        self.axis = normalize_axis(self, attrs.int("axis", -1), max(x.rank, 1))
        self.output_specs = [self.out_spec(x.shape, x.dtype, oq)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        out, axis, zx = outputs[0], self.axis, self.zx

        def compute() -> None:
            d = np.moveaxis(x.astype(np.int64) - zx, axis, -1)
            rows = d.reshape(-1, d.shape[-1])
            result = np.empty_like(rows)
            for k, (row, total) in enumerate(zip(rows, (rows * rows).sum(axis=1), strict=True)):
                m, shift = inv_sqrt_multiplier(int(total))
                result[k] = _mbqm(row, m, shift + 7)
            np.clip(result, -128, 127, out=result)
            np.copyto(out, np.moveaxis(result.reshape(d.shape), -1, axis), casting="unsafe")

        return compute
