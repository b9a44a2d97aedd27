"""int16 Add, Sub and Mul with NumPy broadcasting, as TFLite's reference kernels for
16-bit activations (general scales).

Add/Sub: TFLite's general rescaling with a left shift of 15 (20 for int8: the int16
operands leave no more room in int32):
  a' = MBQM((q_a - z_a) << 15, s_a / 2m),  b' likewise,  m = max(s_a, s_b)
  out = clamp(z_out + MBQM(a' +- b', 2m / (2^15 s_out)))
Mul: out = clamp(z_out + MBQM((q_a - z_a) * (q_b - z_b), s_a s_b / s_out)).

With the `pot_scale_int16` attribute (TFLite's AddOptions/SubOptions flag, true by
default) and zero points 0 and power-of-two scales everywhere, Add and Sub take TFLite's
narrow path instead: the operand whose scale differs from the output's is divided by
the power of two between them (rounding half away from zero), the other is taken as
is, and the int16 sum or difference saturates before the activation clamp.

Two int16 operands have 2^32 pairs, too many for the int8 kernels' table: the
arithmetic runs on int64 copies at each call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.kernels.quantized.int16_sigmoid import checked_log2
from sporenet.lite.ops import OpCode

_LEFT_SHIFT = 15
I64 = np.dtype(np.int64)


class _QBinary16(QuantizedKernel):
    accepts = INT16_DTYPES
    num_inputs = (2, 2)

    requant: Requantizer  # set by each op's __init__

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.quantized_pair()
        shape = self.broadcast_shape(a, b)
        self.sa, self.za = self.tensor_params(a, "input 0")
        self.sb, self.zb = self.tensor_params(b, "input 1")
        oq, self.so, self.zo = self.declared_output(a.dtype)
        self.clamp = self.fused_clamp(self.so, self.zo, a.dtype)
        self.output_specs = [self.out_spec(tuple(shape), a.dtype, oq)]
        self.scratch_layout = [(a.shape, I64), (b.shape, I64), (tuple(shape), I64)]

    def combine(self, a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> Compute:
        """The step writing the int64 accumulator from the widened operands."""
        raise NotImplementedError

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        qa, qb, out = required(inputs, 0), required(inputs, 1), outputs[0]
        a, b, acc = self.scratch_arrays()
        za, zb, requant = self.za, self.zb, self.requant
        combine = self.combine(a, b, acc)
        subtract = np.subtract

        def compute() -> None:
            subtract(qa, za, out=a, dtype=np.int64)
            subtract(qb, zb, out=b, dtype=np.int64)
            combine()
            requant.apply(acc, out)

        return compute


class QAdd16(_QBinary16):
    op = OpCode.ADD
    sign = 1

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.pot = self._pot_shifts(attrs)
        twice_max = 2.0 * max(self.sa, self.sb)
        wide = -(1 << 40), 1 << 40
        self.scale_a = Requantizer(self.sa / twice_max, 0, *wide)
        self.scale_b = Requantizer(self.sb / twice_max, 0, *wide)
        self.requant = Requantizer(twice_max / ((1 << _LEFT_SHIFT) * self.so), self.zo, *self.clamp)

    def _pot_shifts(self, attrs: Attrs) -> tuple[int, int] | None:
        """The right shifts of (a, b) on TFLite's power-of-two path, or None."""
        if not attrs.int("pot_scale_int16", 0) or (self.za, self.zb, self.zo) != (0, 0, 0):
            return None
        logs = [checked_log2(s) for s in (self.sa, self.sb, self.so)]
        if any(v is None for v in logs):
            return None
        la, lb, lo = (int(v) for v in logs if v is not None)
        a, b = self.input(0), self.input(1)
        if a.shape != b.shape:
            raise self.fail(
                f"TFLite's power-of-two int16 path takes equal shapes, got {list(a.shape)} "
                f"and {list(b.shape)} (LiteRT does not broadcast it either)"
            )
        shifts = (lo - la, lo - lb)
        if min(shifts) != 0:
            raise self.fail(
                f"power-of-two int16 scales {self.sa}, {self.sb} -> {self.so}: one input "
                "must share the output's scale and the other be finer (as TFLite requires)"
            )
        return shifts

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        if self.pot is None:
            return super().bind(inputs, outputs)
        qa, qb, out = required(inputs, 0), required(inputs, 1), outputs[0]
        a, b, acc = self.scratch_arrays()
        join = np.add if self.sign > 0 else np.subtract
        (shift_a, shift_b), (lo, hi) = self.pot, self.clamp

        def divide(x: np.ndarray, shift: int) -> None:
            if shift:  # RoundingDivideByPOT: half away from zero
                negative = x < 0
                x += 1 << (shift - 1)
                x -= negative
                x >>= shift

        def compute() -> None:
            np.copyto(a, qa)
            np.copyto(b, qb)
            divide(a, shift_a)
            divide(b, shift_b)
            join(a, b, out=acc)
            np.clip(acc, -32768, 32767, out=acc)
            np.clip(acc, lo, hi, out=acc)
            np.copyto(out, acc, casting="unsafe")

        return compute

    def combine(self, a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> Compute:
        scale_a, scale_b = self.scale_a, self.scale_b
        join = np.add if self.sign > 0 else np.subtract
        left_shift = np.left_shift

        def combine() -> None:
            left_shift(a, _LEFT_SHIFT, out=a)
            scale_a.multiply(a)
            left_shift(b, _LEFT_SHIFT, out=b)
            scale_b.multiply(b)
            join(a, b, out=acc)

        return combine


class QSub16(QAdd16):
    op = OpCode.SUB
    sign = -1


class QMul16(_QBinary16):
    op = OpCode.MUL

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.requant = Requantizer(self.sa * self.sb / self.so, self.zo, *self.clamp)

    def combine(self, a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> Compute:
        return lambda: np.multiply(a, b, out=acc)
