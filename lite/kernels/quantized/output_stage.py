"""The end of every accumulating kernel: bias, requantization, activation clamp, narrowing.

Given integer accumulators (held exactly in float32 or float64 arrays by the GEMM) it
computes clamp(z_out + MultiplyByQuantizedMultiplier(acc + bias, M, shift), lo, hi), the
same result as `Requantizer`, by the cheaper of two exact routes chosen at prepare time:

- float64, when every |acc + bias| * M * 2^left stays below 2^51 (known from the
  accumulators' bound). TFLite's two roundings then fold into one floor: with
  c = M 2^left / 2^(31+e) and h = 2^(e-1) (e = right shift),
      q = floor((acc + bias) c + 2^(-1-e) + [e > 0] / 2 - [z < 0] 2^-e) + z_out,
  where z < 0 (the high-mul's result) exactly when acc + bias < 0 (M > 2^30) or < -1
  (M = 2^30). Every term is a multiple of 2^-(31+e) below 2^52 of them, so the sum is
  exact in float64. The negative correction only moves results that are <= z_out, so it
  is skipped when the clamp's lower bound is >= z_out (relu, relu6).
- int64 (`Requantizer`) otherwise.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.quantized.fixed_point import Requantizer, quantize_multipliers

_FLOAT_EXACT = 1 << 51


class OutputStage:
    """Requantization of accumulators whose channel axis broadcasts as `channel_shape`."""

    def __init__(
        self,
        reals: np.ndarray,
        bias: np.ndarray | None,
        zero_point: int,
        lo: int,
        hi: int,
        acc_bound: int,
        channel_shape: tuple[int, ...],
    ) -> None:
        reals = np.broadcast_to(np.asarray(reals, np.float64), (int(np.prod(channel_shape)),))
        m, shift = quantize_multipliers(reals)
        left = np.maximum(shift, 0)
        right = np.maximum(-shift, 0)
        bias = np.zeros(len(reals), np.int64) if bias is None else bias.astype(np.int64)
        bound = int(acc_bound) + int(np.abs(bias).max(initial=0))
        self.lo, self.hi, self.zo = int(lo), int(hi), int(zero_point)
        self.float_path = bound * int((m << left).max(initial=0)) < _FLOAT_EXACT
        shape = channel_shape
        if self.float_path:
            unit = np.ldexp(1.0, -(31 + right).astype(np.int64))
            coef = (m << left).astype(np.float64) * unit
            offset = (
                bias.astype(np.float64) * coef
                + np.ldexp(1.0, -1 - right)
                + np.where(right > 0, 0.5, 0.0)
                + self.zo
            )
            self.coef, self.offset = coef.reshape(shape), offset.reshape(shape)
            threshold = np.where(m > (1 << 30), 0, -1) - bias  # acc < threshold: z < 0
            self.threshold = threshold.astype(np.float64).reshape(shape)
            self.step = np.where(right > 0, np.ldexp(1.0, -right.astype(np.int64)), 0.0).reshape(
                shape
            )
            self.correct = bool((right > 0).any()) and self.lo < self.zo
        else:
            self.bias = bias.reshape(shape)
            self.requant = Requantizer(reals.reshape(shape), zero_point, lo, hi)

    def bind(self, acc: np.ndarray, out: np.ndarray, wide: np.ndarray) -> Compute:
        """The step writing `out` from `acc` (float32 or float64 integers, same shape);
        `wide` is a float64 (float path) or int64 scratch array of that shape."""
        lo, hi = self.lo, self.hi
        multiply, add, floor, clip = np.multiply, np.add, np.floor, np.clip
        if self.float_path:
            coef, offset, threshold, step = self.coef, self.offset, self.threshold, self.step
            if not self.correct:

                def compute() -> None:
                    multiply(acc, coef, out=wide)
                    add(wide, offset, out=wide)
                    floor(wide, out=wide)
                    clip(wide, lo, hi, out=out, casting="unsafe")

                return compute
            mask = np.empty(acc.shape, bool)
            step_b = np.broadcast_to(step, acc.shape)
            less, subtract = np.less, np.subtract

            def compute_corrected() -> None:
                multiply(acc, coef, out=wide)
                add(wide, offset, out=wide)
                less(acc, threshold, out=mask)
                subtract(wide, step_b, out=wide, where=mask)
                floor(wide, out=wide)
                clip(wide, lo, hi, out=out, casting="unsafe")

            return compute_corrected
        bias, requant, copyto = self.bias, self.requant, np.copyto

        def compute_int() -> None:
            copyto(wide, acc, casting="unsafe")
            add(wide, bias, out=wide)
            requant.apply(wide, out)

        return compute_int

    @property
    def wide_dtype(self) -> np.dtype:
        return np.dtype(np.float64 if self.float_path else np.int64)
