"""TFLite's fixed-point requantization arithmetic, vectorised over NumPy int64 arrays.

A real multiplier m (e.g. input_scale * weight_scale / output_scale) is stored as a Q31
integer M in [2^30, 2^31) and a power-of-two exponent: m = M * 2^(shift - 31).
`multiply_by_quantized_multiplier` is TFLite's MultiplyByQuantizedMultiplier:
RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(x * 2^left, M), right).

Both roundings reduce to shifts. SaturatingRoundingDoublingHighMul(a, M) adds a nudge of
2^30 (or 1 - 2^30 for a negative product) and divides by 2^31 truncating toward zero;
for a negative product, truncation of (p + 1 - 2^30) / 2^31 equals the floor of
(p + 2^30) / 2^31, so both signs are `(p + 2^30) >> 31` (its only saturating case,
a = M = INT32_MIN, cannot happen since M >= 2^30). RoundingDivideByPOT(z, e) rounds half
away from zero: `(z + 2^(e-1) - (z < 0)) >> e` for e > 0.
"""

from __future__ import annotations

import math

import numpy as np

INT_RANGES: dict[np.dtype, tuple[int, int]] = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(np.int32): (-(1 << 31), (1 << 31) - 1),
}
"""Representable range of each quantized dtype."""


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(M, shift) with real ~= M * 2^(shift - 31), M in [2^30, 2^31) (TFLite's
    QuantizeMultiplier, rounding the mantissa half away from zero)."""
    if real == 0.0:
        return 0, 0
    if not math.isfinite(real) or real < 0 or real >= 1 << 30:
        # Files may declare any positive scales; their ratio must still fit TFLite's
        # fixed point (the accumulators are int32).
        raise OverflowError(f"rescaling multiplier {real!r} is outside [0, 2^30)")
    mantissa, shift = math.frexp(real)
    q = math.floor(abs(mantissa) * (1 << 31) + 0.5) * (1 if mantissa > 0 else -1)
    if abs(q) == 1 << 31:
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q, shift


def quantize_multipliers(reals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel `quantize_multiplier`: (M, shift) int64 arrays of reals' shape."""
    flat = [quantize_multiplier(float(r)) for r in np.ravel(reals)]
    m = np.array([f[0] for f in flat], np.int64).reshape(np.shape(reals))
    s = np.array([f[1] for f in flat], np.int64).reshape(np.shape(reals))
    return m, s


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (C's std::round, TfLiteRound)."""
    t = np.trunc(x)
    return t + np.sign(x) * (np.abs(x - t) >= 0.5)


class Requantizer:
    """out = clamp(zero_point + MultiplyByQuantizedMultiplier(acc, M, shift), lo, hi).

    Built once per kernel from the real multipliers (a scalar or one per channel, shaped
    to broadcast against the accumulator); `apply` works in place on an int64 accumulator
    and writes the narrow result into `out`.
    """

    def __init__(
        self,
        real: np.ndarray | float,
        zero_point: int,
        lo: int,
        hi: int,
        *,
        fixed: tuple[int, int] | None = None,
    ) -> None:
        # `fixed`: a (M, shift) pair computed by the caller (TFLite adjusts some, e.g. the
        # mean's 1/n folded into M), used as it is instead of quantizing `real`.
        if fixed is None:
            m, shift = quantize_multipliers(np.asarray(real, np.float64))
        else:
            m, shift = np.array(fixed[0], np.int64), np.array(fixed[1], np.int64)
        self.left = np.left_shift(1, np.maximum(shift, 0)).astype(np.int64)
        self.multiplier = m * self.left  # x * 2^left * M never leaves int64 for int32 x
        right = np.maximum(-shift, 0)
        self.right = right.astype(np.int64)
        self.half = np.where(right > 0, np.left_shift(1, np.maximum(right - 1, 0)), 0).astype(
            np.int64
        )
        self.rounds = bool((right > 0).all())
        self.mixed = bool((right > 0).any()) and not self.rounds
        self.scalar = np.ndim(real) == 0
        if self.scalar:
            self.multiplier = int(self.multiplier)
            self.right, self.half = int(self.right), int(self.half)
        self.zero_point, self.lo, self.hi = int(zero_point), int(lo), int(hi)

    def multiply(self, acc: np.ndarray) -> None:
        """acc = MultiplyByQuantizedMultiplier(acc, M, shift), in place on int64."""
        np.multiply(acc, self.multiplier, out=acc)
        acc += 1 << 30
        acc >>= 31
        if self.rounds:
            neg = acc < 0
            acc += self.half
            acc -= neg
            acc >>= self.right
        elif self.mixed:
            neg = (acc < 0) & (self.right > 0)
            acc += self.half
            acc -= neg
            acc >>= self.right

    def apply(self, acc: np.ndarray, out: np.ndarray) -> None:
        """Requantize the int64 `acc` (clobbered) into `out`: multiply, add the zero point,
        clamp, narrow."""
        self.multiply(acc)
        acc += self.zero_point
        # Not np.clip: its Python wrapper costs more than the two ufuncs on small tensors.
        np.maximum(acc, self.lo, out=acc)
        np.minimum(acc, self.hi, out=acc)
        np.copyto(out, acc, casting="unsafe")


def activation_range(
    name: str, scale: float, zero_point: int, dtype: np.dtype, attrs: dict | None = None
) -> tuple[int, int]:
    """The clamp a fused activation becomes on a quantized output (TFLite's
    CalculateActivationRangeQuantized): relu -> [q(0), max], relu6 -> [q(0), q(6)],
    clip -> [q(clip_min), q(clip_max)]; q(f) = zero_point + round(f / scale) in float32."""
    lo, hi = INT_RANGES[np.dtype(dtype)]
    attrs = attrs or {}

    def q(f: float) -> int:
        v = np.float32(f) / np.float32(scale)
        return zero_point + int(round_half_away(np.asarray(v, np.float64)))

    if name in ("none", None):
        return lo, hi
    if name == "relu":
        return max(lo, q(0.0)), hi
    if name == "relu6":
        return max(lo, q(0.0)), min(hi, q(6.0))
    if name == "clip":
        cmin = float(attrs.get("clip_min", -np.inf))
        cmax = float(attrs.get("clip_max", np.inf))
        return (
            lo if cmin == -np.inf else max(lo, q(cmin)),
            hi if cmax == np.inf else min(hi, q(cmax)),
        )
    return lo, hi  # not a clamp: the caller refuses it


class WideRequantizer:
    """out = clamp(zero_point + MultiplyByQuantizedMultiplier(acc, M, shift), lo, hi) for
    int64 accumulators, as TFLite's int16x8 kernels compute it, with one rounding
    (half up) at the end:

    - `reduced` (Conv2D, depthwise): the Q31 multiplier rounded to 16 bits
      (M16 = (M + 2^15) >> 16, or 2^15 - 1 near 2^31), out = (acc M16 + 2^(14 - shift))
      >> (15 - shift); exact in int64 for accumulators below 2^47, as TFLite assumes;
    - otherwise (FullyConnected): out = (acc M + 2^(30 - shift)) >> (31 - shift); the
      product may pass 2^63, so it is formed in two halves of M (M = 2^16 Mh + Ml):
      floor((acc Mh 2^16 + acc Ml + r) / 2^t) = (acc Mh + ((acc Ml + r) >> 16)) >> (t - 16),
      exact for accumulators below 2^46.
    """

    def __init__(
        self, real: np.ndarray | float, zero_point: int, lo: int, hi: int, *, reduced: bool
    ) -> None:
        m, shift = quantize_multipliers(np.asarray(real, np.float64))
        if reduced:
            m = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
            total = 15 - shift
        else:
            total = 31 - shift
        if (total < 1).any():
            raise OverflowError(f"rescaling multiplier {real!r} is too large for int16x8")
        self.multiplier = m.astype(np.int64)
        self.total = total.astype(np.int64)
        self.round = np.left_shift(np.int64(1), self.total - 1)
        self.split = not reduced and bool((total >= 16).all())
        if not reduced and not self.split:
            raise OverflowError(f"rescaling multiplier {real!r} is too large for int16x8")
        self.high, self.low = self.multiplier >> 16, self.multiplier & 0xFFFF
        self.zero_point, self.lo, self.hi = int(zero_point), int(lo), int(hi)

    def apply(self, acc: np.ndarray, out: np.ndarray) -> None:
        """Requantize the int64 `acc` (clobbered) into `out`."""
        if self.split:
            low = acc * self.low
            low += self.round
            low >>= 16
            np.multiply(acc, self.high, out=acc)
            acc += low
            np.right_shift(acc, self.total - 16, out=acc)
        else:
            np.multiply(acc, self.multiplier, out=acc)
            acc += self.round
            np.right_shift(acc, self.total, out=acc)
        acc += self.zero_point
        # Not np.clip: its Python wrapper costs more than the two ufuncs on small tensors.
        np.maximum(acc, self.lo, out=acc)
        np.minimum(acc, self.hi, out=acc)
        np.copyto(out, acc, casting="unsafe")
