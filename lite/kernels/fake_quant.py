"""FAKE_QUANT: quantize and dequantize in float, so training sees the int8 rounding.

FAKE_QUANT(x, min, max) rounds x to the grid an int8 kernel would use for the range
[min, max]: the range is widened to contain 0 and nudged so that 0 is a grid point (the
grid is scale * (q - zero_point), q in [quant_min, quant_max]), x is clamped into it and
rounded half to even, as the converter's quantizer rounds. Attributes: `num_bits` (8),
`narrow_range` (1: q in [1, 2^bits - 1], the symmetric [-127, 127] of int8 weights) and
`axis` (per-channel min/max along that axis of x; per tensor when min and max hold one
value). Without min and max inputs (`symmetric` weights), the range of each slice is
[-max |x|, max |x|], so the grid is the one the converter gives per-channel weights.

FAKE_QUANT_GRAD(g, x, min, max) is its straight-through gradient: dx = g where x lies
inside the nudged range and 0 outside; dmin and dmax collect g where x was clamped below
or above (so the range can be learned, as in TensorFlow's FakeQuantWithMinMaxVars).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode


def grid(
    lo: np.ndarray, hi: np.ndarray, num_bits: int, narrow_range: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, nudged_min, nudged_max) of the quantization grid for ranges [lo, hi]."""
    quant_min, quant_max = (1 if narrow_range else 0), 2**num_bits - 1
    lo = np.minimum(lo.astype(np.float64), 0.0)
    hi = np.maximum(hi.astype(np.float64), 0.0)
    span = hi - lo
    empty = span <= 0
    scale = np.where(empty, 1.0, span / (quant_max - quant_min)).astype(np.float32)
    scale64 = scale.astype(np.float64)
    zero_point = np.clip(np.rint(quant_min - lo / scale64), quant_min, quant_max)
    nudged_min = np.where(empty, 0.0, (quant_min - zero_point) * scale64)
    nudged_max = np.where(empty, 0.0, (quant_max - zero_point) * scale64)
    return scale, nudged_min.astype(np.float32), nudged_max.astype(np.float32)


def fake_quantize(
    x: np.ndarray, scale: np.ndarray, lo: np.ndarray, hi: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """out = round((clip(x, lo, hi) - lo) / scale) * scale + lo (arrays broadcast to x)."""
    np.clip(x, lo, hi, out=out)
    out -= lo
    out /= scale
    np.rint(out, out=out)
    out *= scale
    out += lo
    return out


class _FakeQuantBase(Kernel):
    """Shared prepare: attributes, and where min/max broadcast against x."""

    x_index = 0

    def prepare_range(self, attrs: Attrs) -> TensorSpec:
        x = self.require_float(self.x_index)
        self.num_bits = attrs.int("num_bits", 8)
        if not 2 <= self.num_bits <= 16:
            raise self.fail(f"num_bits must be in 2..16, got {self.num_bits}")
        self.narrow = bool(attrs.int("narrow_range", 0))
        lo = self.optional_input(self.x_index + 1)
        hi = self.optional_input(self.x_index + 2)
        if (lo is None) != (hi is None):
            raise self.fail("min and max must be given together (or neither, symmetric)")
        self.symmetric = lo is None
        axis = attrs.int("axis", -1 if not self.symmetric else 0)
        per_channel = self.symmetric and attrs.int("per_channel", 1) == 1
        if lo is not None and hi is not None:
            if lo.shape != hi.shape:
                raise self.fail(f"min {list(lo.shape)} and max {list(hi.shape)} differ in shape")
            per_channel = lo.size != 1
            if per_channel and (not -x.rank <= axis < x.rank or lo.size != x.shape[axis]):
                raise self.fail(
                    f"{lo.size} per-channel ranges do not match axis {axis} of x {list(x.shape)}"
                )
        self.range_shape = tuple(lo.shape) if lo is not None else ()
        self.axis = axis % max(x.rank, 1) if per_channel else None
        # Shape that makes a per-channel range broadcast against x.
        self.bshape = [1] * x.rank
        if self.axis is not None:
            self.bshape[self.axis] = -1
        self.reduce_axes = tuple(d for d in range(x.rank) if d != self.axis)
        return x

    def ranges(
        self, x: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The grid (scale, nudged min, nudged max) shaped to broadcast against x."""
        if lo is None or hi is None:
            if self.axis is None:
                bound = np.abs(x).max(initial=0.0).reshape(1)
            else:
                bound = np.abs(x).max(axis=self.reduce_axes, initial=0.0)
            lo, hi = -bound, bound
        scale, nlo, nhi = grid(np.asarray(lo), np.asarray(hi), self.num_bits, self.narrow)
        shape = self.bshape if self.axis is not None else [1] * x.ndim
        return scale.reshape(shape), nlo.reshape(shape), nhi.reshape(shape)


class FakeQuant(_FakeQuantBase):
    """x rounded to its int8 grid, in float (see the module docstring)."""

    op = OpCode.FAKE_QUANT
    num_inputs = (1, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.prepare_range(attrs)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, lo, hi = [*inputs, None, None][:3]
        out = outputs[0]

        def run() -> None:
            scale, nlo, nhi = self.ranges(x, lo, hi)
            fake_quantize(x, scale, nlo, nhi, out)

        return run


class FakeQuantGrad(_FakeQuantBase):
    """Straight-through gradient of FAKE_QUANT: outputs dx (and dmin, dmax with ranges)."""

    op = OpCode.FAKE_QUANT_GRAD
    num_inputs = (2, 4)
    x_index = 1

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g = self.require_float(0)
        x = self.prepare_range(attrs)
        if g.shape != x.shape:
            raise self.fail(f"gradient {list(g.shape)} differs from x {list(x.shape)}")
        self.output_specs = [TensorSpec(x.shape, x.dtype)]
        if not self.symmetric:
            self.output_specs += [TensorSpec(self.range_shape, x.dtype)] * 2

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, lo, hi = [*inputs, None, None][:4]
        dx = outputs[0]
        if self.symmetric:  # the range is x's own: nothing lies outside it
            grad = required(inputs, 0)
            return lambda: np.copyto(dx, grad)

        def run() -> None:
            np.copyto(dx, g)
            _, nlo, nhi = self.ranges(x, lo, hi)
            below, above = x < nlo, x > nhi
            dx[below | above] = 0
            if len(outputs) == 3:
                axes = self.reduce_axes if self.axis is not None else None
                for mask, out in ((below, outputs[1]), (above, outputs[2])):
                    total = np.where(mask, g, 0).sum(axis=axes)
                    out[...] = np.reshape(total, out.shape)

        return run
