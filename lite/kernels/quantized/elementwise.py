"""Quantized Add, Sub and Mul with NumPy broadcasting, as TFLite's int8 reference kernels.

Add/Sub: both inputs are shifted left by 20 bits and rescaled to a common scale (twice
the larger input scale), summed, and requantized to the output:
  a' = MBQM((q_a - z_a) << 20, s_a / 2m),  b' likewise,  m = max(s_a, s_b)
  out = clamp(z_out + MBQM(a' +- b', 2m / (2^20 s_out)))
Mul: out = clamp(z_out + MBQM((q_a - z_a) * (q_b - z_b), s_a s_b / s_out)).

Each output depends only on the two input bytes, so the arithmetic above runs once, at
prepare time, over all 256 x 256 pairs; a call is one lookup in that 64 KiB table at
index byte_a * 256 + byte_b (broadcasting as NumPy does).

With the node attribute rounding="onnx" the table holds what onnxruntime computes for a
QDQ Add/Sub/Mul (DequantizeLinear of each input in float32, the float op in float32,
QuantizeLinear: division by s_out, ties to even, + z_out, saturate).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.ops import OpCode

_LEFT_SHIFT = 20


class _QBinary(QuantizedKernel):
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.quantized_pair()
        shape = self.broadcast_shape(a, b)
        self.sa, za = self.tensor_params(a, "input 0")
        self.sb, zb = self.tensor_params(b, "input 1")
        self.za, self.zb = np.int64(za), np.int64(zb)
        oq, self.so, zo = self.declared_output(a.dtype)
        self.zo = zo
        self.clamp = self.fused_clamp(self.so, zo, a.dtype)
        self.output_specs = [self.out_spec(tuple(shape), a.dtype, oq)]
        self.scratch_layout = [(tuple(shape), np.dtype(np.uint16))]
        self.dtype = a.dtype

    def evaluate(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The int64 arithmetic on broadcast operands (prepare time only)."""
        raise NotImplementedError

    def table(self) -> np.ndarray:
        """out for every (byte_a, byte_b), flattened to 65536 entries."""
        values = np.arange(256, dtype=np.uint8).view(self.dtype).astype(np.int64)
        a, b = values[:, None], values[None, :]
        if self.rounding == "onnx":
            return self.evaluate_onnx(a, b).astype(self.dtype).ravel()
        return self.evaluate(a, b).astype(self.dtype).ravel()

    def evaluate_onnx(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """onnxruntime's DequantizeLinear -> float op -> QuantizeLinear, in float32."""
        fa = (a - self.za).astype(np.float32) * np.float32(self.sa)
        fb = (b - self.zb).astype(np.float32) * np.float32(self.sb)
        value = np.rint(self.float_op(fa, fb) / np.float32(self.so)) + np.float32(self.zo)
        return np.clip(value, *self.clamp).astype(np.int64)

    float_op = staticmethod(np.add)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b = required(inputs, 0).view(np.uint8), required(inputs, 1).view(np.uint8)
        out = outputs[0]
        (index,) = self.scratch_arrays()
        table = self.lookup
        left_shift, bitwise_or, take = np.left_shift, np.bitwise_or, table.take

        def compute() -> None:
            left_shift(a, 8, out=index, dtype=np.uint16)
            bitwise_or(index, b, out=index)
            take(index, out=out, mode="clip")

        return compute


class QAdd(_QBinary):
    op = OpCode.ADD
    combine = staticmethod(np.add)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        twice_max = 2.0 * max(self.sa, self.sb)
        self.scale_a = Requantizer(self.sa / twice_max, 0, 0, 0)
        self.scale_b = Requantizer(self.sb / twice_max, 0, 0, 0)
        self.requant = Requantizer(twice_max / ((1 << _LEFT_SHIFT) * self.so), self.zo, *self.clamp)
        self.lookup = self.table()

    def evaluate(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a64 = (a - self.za) << _LEFT_SHIFT
        self.scale_a.multiply(a64)
        b64 = (b - self.zb) << _LEFT_SHIFT
        self.scale_b.multiply(b64)
        acc = self.combine(a64, b64)
        out = np.empty(acc.shape, np.int64)
        self.requant.apply(acc, out)
        return out


class QSub(QAdd):
    op = OpCode.SUB
    combine = staticmethod(np.subtract)
    float_op = staticmethod(np.subtract)


class QMul(_QBinary):
    op = OpCode.MUL
    float_op = staticmethod(np.multiply)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.requant = Requantizer(self.sa * self.sb / self.so, self.zo, *self.clamp)
        self.lookup = self.table()

    def evaluate(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        acc = (a - self.za) * (b - self.zb)
        out = np.empty(acc.shape, np.int64)
        self.requant.apply(acc, out)
        return out
