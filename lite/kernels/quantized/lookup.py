"""int8/uint8 unary math as 256-entry lookup tables: ABS, EXP, LOG, RSQRT, ELU and GELU
on the parameters a TFLite file declares, and NEG as LiteRT runs it.

Each of the 256 possible inputs is dequantized, mapped through the function in float64
and requantized to the output's parameters (ties away from zero, clamped), once at
prepare time, as LiteRT's own lookup-table kernels (EXP, ELU, GELU) do; LiteRT's
fixed-point ABS and RSQRT land within one step of it. A result that is not a number
(LOG or RSQRT of a negative value) maps to the lowest integer, infinities to the ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.activation import _params
from sporenet.lite.kernels.quantized.base import QuantizedKernel, byte_lookup, dtype_range
from sporenet.lite.kernels.quantized.fixed_point import round_half_away
from sporenet.lite.ops import OpCode

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _table(
    f: Callable[[np.ndarray], np.ndarray], dtype: np.dtype, sx: float, zx: int, so: float, zo: int
) -> np.ndarray:
    lo, hi = dtype_range(dtype)
    q = np.arange(256).astype(np.uint8).view(dtype).astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        real = f(sx * (q - zx).astype(np.float64))
        real = np.where(np.isnan(real), -np.inf, real) / so
    out = np.clip(round_half_away(np.clip(real, lo - zo - 1, hi - zo + 1)) + zo, lo, hi)
    return out.astype(dtype)


class _QTable(QuantizedKernel):
    """A unary op whose int8 form is one table lookup per element."""

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        raise NotImplementedError

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, sx, zx, so, zo = _params(self)
        self.table = _table(self.function(), x.dtype, sx, zx, so, zo)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return byte_lookup(self.table, required(inputs, 0), outputs[0])


class QAbs(_QTable):
    op = OpCode.ABS

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        return np.abs


class QNeg(QuantizedKernel):
    """LiteRT's int8 NEG: the stored integers negated, whatever the parameters (-128
    wraps to itself, as the C++ cast does)."""

    op = OpCode.NEG

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = _params(self)[0]
        q = np.arange(256).astype(np.uint8).view(x.dtype).astype(np.int64)
        self.table = (-q).astype(np.uint8 if x.dtype == np.uint8 else np.int8).view(x.dtype)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return byte_lookup(self.table, required(inputs, 0), outputs[0])


class QExp(_QTable):
    op = OpCode.EXP

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        return np.exp


class QLog(_QTable):
    op = OpCode.LOG

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        return np.log


class QRsqrt(_QTable):
    op = OpCode.RSQRT

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        return lambda v: 1.0 / np.sqrt(v)


class QElu(_QTable):
    op = OpCode.ELU

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        alpha = self.attrs.float("alpha", 1.0)
        return lambda v: np.where(v > 0, v, alpha * np.expm1(np.minimum(v, 0.0)))


class QGelu(_QTable):
    op = OpCode.GELU

    def function(self) -> Callable[[np.ndarray], np.ndarray]:
        approximate = self.attrs.str("approximate", "none")
        if approximate == "tanh":
            c = math.sqrt(2.0 / math.pi)
            return lambda v: 0.5 * v * (1.0 + np.tanh(c * (v + 0.044715 * v**3)))
        if approximate != "none":
            raise self.fail(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        return lambda v: 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0)))
