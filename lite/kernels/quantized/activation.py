"""Quantized activations.

- Relu, Relu6, Clip are clamps of the quantized range (TFLite's ReluX): with the output's
  parameters equal to the input's, a clip to [q(lo), q(hi)]; otherwise the input is
  requantized (MultiplyByQuantizedMultiplier) and then clamped.
- Logistic, Tanh, HardSwish, SiLU map each of the 256 possible inputs through a lookup table
  built at prepare time: table[q] = clamp(z_out + round(f(s_in (q - z_in)) / s_out)),
  evaluated in float64, ties rounded away from zero.

With the node attribute rounding="onnx" the tables (and the requantizing clamps, as a
table) hold onnxruntime's float path instead: DequantizeLinear in float32, the function
in float32, QuantizeLinear (division by s_out in float32, ties to even).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel, byte_lookup, dtype_range
from sporenet.lite.kernels.quantized.fixed_point import (
    Requantizer,
    activation_range,
    round_half_away,
)
from sporenet.lite.ops import OpCode


def _params(kernel: QuantizedKernel) -> tuple[TensorSpec, float, int, float, int]:
    x = kernel.quantized_input(0)
    sx, zx = kernel.tensor_params(x, "the input")
    oq = kernel.attrs.output_quant[0] if kernel.attrs.output_quant else None
    oq = oq if oq is not None else kernel.quantization(x, "the input")
    so, zo = kernel.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
    kernel.output_specs = [kernel.out_spec(x.shape, x.dtype, oq)]
    return x, sx, zx, so, zo


class _QClamp(QuantizedKernel):
    """Shared bind of Relu/Relu6/Clip; subclasses set the real bounds (lo, hi)."""

    def prepare_clamp(self, lo: float | None, hi: float | None) -> None:
        x, sx, zx, so, zo = _params(self)
        name_attrs = {
            "clip_min": -np.inf if lo is None else lo,
            "clip_max": np.inf if hi is None else hi,
        }
        self.lo, self.hi = activation_range("clip", so, zo, x.dtype, name_attrs)
        self.requant = None
        self.table: np.ndarray | None = None
        if (sx, zx) != (so, zo) and self.rounding == "onnx":
            lo_f = -np.inf if lo is None else lo
            hi_f = np.inf if hi is None else hi
            self.table = onnx_lookup_table(
                lambda v: np.clip(v, np.float32(lo_f), np.float32(hi_f)), x.dtype, sx, zx, so, zo
            )
        elif (sx, zx) != (so, zo):
            self.zx = np.int64(zx)
            self.requant = Requantizer(sx / so, zo, self.lo, self.hi)
            self.scratch_layout = [(x.shape, np.dtype(np.int64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        lo, hi = self.lo, self.hi
        if self.table is not None:
            return byte_lookup(self.table, x, out)
        if self.requant is None:
            return lambda: np.clip(x, lo, hi, out=out)
        (acc,) = self.scratch_arrays()
        zx, requant = self.zx, self.requant

        def compute() -> None:
            np.subtract(x, zx, out=acc)
            requant.apply(acc, out)

        return compute


class QRelu(_QClamp):
    op = OpCode.RELU

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.prepare_clamp(0.0, None)


class QRelu6(_QClamp):
    op = OpCode.RELU6

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.prepare_clamp(0.0, 6.0)


class QClip(_QClamp):
    """Bounds (real values) from the `min`/`max` attributes or constant inputs 1 and 2
    (float, or quantized like the input)."""

    op = OpCode.CLIP
    num_inputs = (1, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        bounds: list[float | None] = []
        for k, name in ((1, "min"), (2, "max")):
            spec = self.optional_input(k)
            if spec is None:
                bounds.append(attrs.float(name))
                continue
            value = self.constant(k, name)
            if value.size != 1:
                raise self.fail(
                    f"input {k} ({name}) must hold one value, got shape {list(value.shape)}"
                )
            v = float(value.flat[0])
            if spec.quant is not None:
                zp = int(spec.quant.zero_point.flat[0]) if spec.quant.zero_point.size else 0
                v = float(spec.quant.scale.flat[0]) * (v - zp)
            bounds.append(v)
        self.prepare_clamp(bounds[0], bounds[1])


def _logistic(x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    return one / (one + np.exp(-x))


def _hard_swish(x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    return x * np.clip(x + t(3), t(0), t(6)) / t(6)


def _silu(x: np.ndarray) -> np.ndarray:
    one = x.dtype.type(1)
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x: x / inf = -0
        return x / (one + np.exp(-x))


def lookup_table(
    f: Callable[[np.ndarray], np.ndarray], dtype: np.dtype, sx: float, zx: int, so: float, zo: int
) -> np.ndarray:
    """256 outputs indexed by the input's bytes (q viewed as uint8)."""
    lo, hi = dtype_range(dtype)
    q = np.arange(256).astype(np.uint8).view(dtype).astype(np.int64)
    real = f(sx * (q - zx).astype(np.float64))
    out = zo + round_half_away(real / so)
    return np.clip(out, lo, hi).astype(dtype)


def onnx_lookup_table(
    f: Callable[[np.ndarray], np.ndarray], dtype: np.dtype, sx: float, zx: int, so: float, zo: int
) -> np.ndarray:
    """`lookup_table` as onnxruntime computes DequantizeLinear -> f -> QuantizeLinear."""
    lo, hi = dtype_range(dtype)
    q = np.arange(256).astype(np.uint8).view(dtype).astype(np.int64)
    real = np.asarray(f((q - zx).astype(np.float32) * np.float32(sx)), np.float32)
    out = np.rint(real / np.float32(so)) + np.float32(zo)
    return np.clip(out, lo, hi).astype(dtype)


class _QLookup(QuantizedKernel):
    function: Callable[[np.ndarray], np.ndarray]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, sx, zx, so, zo = _params(self)
        make = onnx_lookup_table if self.rounding == "onnx" else lookup_table
        self.table = make(type(self).function, x.dtype, sx, zx, so, zo)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return byte_lookup(self.table, required(inputs, 0), outputs[0])


class QLogistic(_QLookup):
    op = OpCode.SIGMOID
    function = staticmethod(_logistic)


class QTanh(_QLookup):
    op = OpCode.TANH
    function = staticmethod(np.tanh)


class QHardSwish(_QLookup):
    op = OpCode.HARD_SWISH
    function = staticmethod(_hard_swish)


class QSilu(_QLookup):
    op = OpCode.SILU
    function = staticmethod(_silu)
