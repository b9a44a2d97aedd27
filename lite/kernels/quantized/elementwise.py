"""Quantized Add, Sub and Mul with NumPy broadcasting, as TFLite's int8 reference kernels.

Add/Sub: both inputs are shifted left by 20 bits and rescaled to a common scale (twice
the larger input scale), summed, and requantized to the output:
  a' = MBQM((q_a - z_a) << 20, s_a / 2m),  b' likewise,  m = max(s_a, s_b)
  out = clamp(z_out + MBQM(a' +- b', 2m / (2^20 s_out)))
Mul: out = clamp(z_out + MBQM((q_a - z_a) * (q_b - z_b), s_a s_b / s_out)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec
from sporenet.lite.kernels.quantized.base import QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.ops import OpCode

_LEFT_SHIFT = 20


class _QBinary(QuantizedKernel):
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.quantized_input(0), self.quantized_input(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs must share a dtype, got {a.dtype} and {b.dtype}")
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise self.fail(
                f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast"
            ) from None
        self.sa, za = self.tensor_params(a, "input 0")
        self.sb, zb = self.tensor_params(b, "input 1")
        self.za, self.zb = np.int64(za), np.int64(zb)
        oq = self.output_quant(a.dtype)
        self.so, zo = self.tensor_params(TensorSpec((), a.dtype, quant=oq), "the output")
        self.zo = zo
        self.clamp = self.fused_clamp(self.so, zo, a.dtype)
        self.output_specs = [self.out_spec(tuple(shape), a.dtype, oq)]
        self.scratch_layout = [
            (a.shape, np.dtype(np.int64)),
            (b.shape, np.dtype(np.int64)),
            (tuple(shape), np.dtype(np.int64)),
        ]


class QAdd(_QBinary):
    op = OpCode.ADD
    combine = staticmethod(np.add)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        twice_max = 2.0 * max(self.sa, self.sb)
        self.scale_a = Requantizer(self.sa / twice_max, 0, 0, 0)
        self.scale_b = Requantizer(self.sb / twice_max, 0, 0, 0)
        self.requant = Requantizer(twice_max / ((1 << _LEFT_SHIFT) * self.so), self.zo, *self.clamp)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out = inputs[0], inputs[1], outputs[0]
        a64, b64, acc = self.scratch_arrays()
        za, zb, sa, sb, requant = self.za, self.zb, self.scale_a, self.scale_b, self.requant
        subtract, combine = np.subtract, self.combine

        def compute() -> None:
            subtract(a, za, out=a64)
            np.left_shift(a64, _LEFT_SHIFT, out=a64)
            sa.multiply(a64)
            subtract(b, zb, out=b64)
            np.left_shift(b64, _LEFT_SHIFT, out=b64)
            sb.multiply(b64)
            combine(a64, b64, out=acc)
            requant.apply(acc, out)

        return compute


class QSub(QAdd):
    op = OpCode.SUB
    combine = staticmethod(np.subtract)


class QMul(_QBinary):
    op = OpCode.MUL

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.requant = Requantizer(self.sa * self.sb / self.so, self.zo, *self.clamp)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out = inputs[0], inputs[1], outputs[0]
        a64, b64, acc = self.scratch_arrays()
        za, zb, requant, subtract, multiply = (
            self.za,
            self.zb,
            self.requant,
            np.subtract,
            np.multiply,
        )

        def compute() -> None:
            subtract(a, za, out=a64)
            subtract(b, zb, out=b64)
            multiply(a64, b64, out=acc)
            requant.apply(acc, out)

        return compute
