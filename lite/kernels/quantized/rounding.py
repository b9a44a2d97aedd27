"""Requantization rounding modes of the int8 kernels, chosen per node.

- "tflite" (default): TFLite's fixed-point arithmetic (`fixed_point`, `output_stage`),
  bit-exact with LiteRT's int8 kernels.
- "onnx": onnxruntime's float requantization (its QLinearConv, QLinearMatMul, QGemm and
  QuantizeLinear): the multiplier is float32(float32(s_in * s_w) / s_out), the int32
  accumulator plus bias is converted to float32, multiplied by it in float32, rounded
  half to even, offset by the zero point and saturated. The ONNX importer sets it on the
  nodes of quantized ONNX models, so they run as onnxruntime runs them.

The mode is the node attribute `rounding`; kernels read it at prepare time.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.kernels.base import Compute

ROUNDING_MODES = ("tflite", "onnx")


def onnx_multipliers(s_in: float, s_w: np.ndarray | float, s_out: float) -> np.ndarray:
    """onnxruntime's output scales: (s_in * s_w) / s_out, each step in float32."""
    product = np.float32(s_in) * np.asarray(s_w, np.float32)
    return np.asarray(product / np.float32(s_out), np.float32)


class OnnxOutputStage:
    """The "onnx" counterpart of `OutputStage`: clamp(rint(float32(acc + bias) * m) + z).

    Same interface (`bind`, `wide_dtype`); the scratch `wide` is float32.
    """

    def __init__(
        self,
        multipliers: np.ndarray,
        bias: np.ndarray | None,
        zero_point: int,
        lo: int,
        hi: int,
        channel_shape: tuple[int, ...],
    ) -> None:
        size = int(np.prod(channel_shape))
        m = np.broadcast_to(np.asarray(multipliers, np.float32), (size,))
        self.scalar = bool((m == m[0]).all())
        self.mult: np.ndarray | np.float32 = m[0] if self.scalar else m.reshape(channel_shape)
        self.bias = (
            None
            if bias is None or not np.any(bias)
            else (np.asarray(bias, np.float64).reshape(channel_shape))
        )
        self.zo, self.lo, self.hi = np.float32(zero_point), int(lo), int(hi)

    @property
    def wide_dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def bind(self, acc: np.ndarray, out: np.ndarray, wide: np.ndarray) -> Compute:
        """The step writing `out` from the exact integer accumulators `acc` (float32 or
        float64); `wide` is float32 scratch of the same shape."""
        mult, bias, zo, lo, hi = self.mult, self.bias, self.zo, self.lo, self.hi
        add, multiply, rint, clip = np.add, np.multiply, np.rint, np.clip

        def compute() -> None:
            if bias is not None:
                # The sum is exact in float64; one rounding to float32, as cvtdq2ps.
                add(acc, bias, out=wide, casting="unsafe")
                multiply(wide, mult, out=wide)
            else:
                multiply(acc, mult, out=wide, dtype=np.float32, casting="unsafe")
            rint(wide, out=wide)  # half to even (the default FP rounding mode)
            add(wide, zo, out=wide)
            clip(wide, lo, hi, out=out, casting="unsafe")

        return compute


class OnnxRequantizer:
    """`Requantizer`'s "onnx" counterpart for int64 accumulators (QMatMul)."""

    def __init__(self, multipliers: np.ndarray, zero_point: int, lo: int, hi: int) -> None:
        self.mult = np.asarray(multipliers, np.float32)
        self.zo, self.lo, self.hi = np.float32(zero_point), int(lo), int(hi)

    def apply(self, acc: np.ndarray, out: np.ndarray) -> None:
        wide = np.multiply(acc, self.mult, dtype=np.float32, casting="unsafe")
        np.rint(wide, out=wide)
        wide += self.zo
        np.clip(wide, self.lo, self.hi, out=out, casting="unsafe")
