"""What every quantized kernel shares: reading quantization parameters at prepare time
and the output quantization the file declares.

A quantized kernel lists the temporary arrays its step needs in `scratch_layout` and takes
them in `bind` with `scratch_arrays` (Kernel): they come from the plan's arena by lifetime,
so float copies of int8 weights and the float/int64 accumulators occupy memory only while
their step runs, not once per layer.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.base import Compute, Kernel, TensorSpec
from sporenet.lite.kernels.quantized.fixed_point import INT_RANGES, activation_range
from sporenet.lite.kernels.quantized.rounding import ROUNDING_MODES
from sporenet.lite.opset.decl import CLAMPS

QUANTIZED_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))
INT16_DTYPES = (np.dtype(np.int16),)  # tfliteq: int16x8 activations


def is_quantized(spec: TensorSpec | None) -> bool:
    """An int8/uint8 tensor carrying quantization parameters (dispatches to these kernels)."""
    return spec is not None and spec.dtype in QUANTIZED_DTYPES and spec.quant is not None


def is_int16_quantized(spec: TensorSpec | None) -> bool:
    """An int16 tensor carrying quantization parameters: an int16x8 activation (TFLite's
    16-bit activations with 8-bit weights), run by the int16 kernels."""
    return spec is not None and spec.dtype in INT16_DTYPES and spec.quant is not None


def per_tensor(quant: Quantization) -> bool:
    return quant.scale.size == 1


class QuantizedKernel(Kernel):
    """Base class of the int8/uint8 (and int16x8) kernels."""

    # The activation dtypes the kernel takes (int16 kernels set INT16_DTYPES).
    accepts: ClassVar[tuple[np.dtype, ...]] = QUANTIZED_DTYPES

    # ---- quantization parameters
    def quantized_input(self, index: int) -> TensorSpec:
        spec = self.input(index)
        if spec.dtype not in self.accepts or spec.quant is None:
            missing = " without quantization" if spec.quant is None else ""
            names = "/".join(str(d) for d in self.accepts)
            raise self.fail(
                f"input {index} must be an {names} tensor with quantization, "
                f"got {spec.dtype}{missing}"
            )
        return spec

    def quantization(self, spec: TensorSpec, what: str) -> Quantization:
        """The quantization parameters of `spec` (a quantized input, checked present)."""
        if spec.quant is None:
            raise self.fail(f"{what} must carry quantization parameters, got none")
        return spec.quant

    def tensor_params(self, spec: TensorSpec, what: str) -> tuple[float, int]:
        """(scale, zero_point) of a per-tensor quantized tensor."""
        q = spec.quant
        if q is None or not per_tensor(q):
            raise self.fail(
                f"{what} must be quantized per tensor (one scale), got "
                f"{'none' if q is None else f'{q.scale.size} scales'}"
            )
        zp = int(q.zero_point.flat[0]) if q.zero_point.size else 0
        return float(q.scale.flat[0]), zp

    def quantized_pair(self) -> tuple[TensorSpec, TensorSpec]:
        """Inputs 0 and 1 of a binary op: quantized, of one dtype, per tensor."""
        a, b = self.quantized_input(0), self.quantized_input(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs must share a dtype, got {a.dtype} and {b.dtype}")
        self.tensor_params(a, "input 0")
        self.tensor_params(b, "input 1")
        return a, b

    def declared_output(self, dtype: np.dtype) -> tuple[Quantization, float, int]:
        """The quantization the file declares on output 0, with its (scale, zero point)."""
        oq = self.output_quant(dtype)
        scale, zero = self.tensor_params(TensorSpec((), dtype, quant=oq), "the output")
        return oq, scale, zero

    def output_quant(self, dtype: np.dtype, index: int = 0) -> Quantization:
        """The quantization the file declares on output `index` (required, per tensor)."""
        oq = self.attrs.output_quant
        q = oq[index] if index < len(oq) else None
        if q is None:
            raise self.fail(
                f"output {index} ({dtype}) needs quantization parameters (the file declares none)"
            )
        if not per_tensor(q):
            raise self.fail(
                f"output {index} must be quantized per tensor, got {q.scale.size} scales"
            )
        return q

    def out_spec(
        self,
        shape: tuple[int, ...],
        dtype: np.dtype,
        quant: Quantization,
    ) -> TensorSpec:
        return TensorSpec(tuple(shape), np.dtype(dtype), quant=quant)

    def fused_clamp(self, scale: float, zero_point: int, dtype: np.dtype) -> tuple[int, int]:
        """The fused activation attribute as a clamp of the quantized output."""
        name = self.attrs.values.get("activation", "none")
        if name not in CLAMPS:
            raise self.fail(f"fused activation {name!r} has no int8 form (none, relu, relu6, clip)")
        return activation_range(name, scale, zero_point, dtype, self.attrs.values)

    @property
    def rounding(self) -> str:
        """The node's requantization mode (`rounding` attribute): "tflite" or "onnx"."""
        mode = self.attrs.values.get("rounding", "tflite")
        if mode not in ROUNDING_MODES:
            raise self.fail(f"rounding must be one of {list(ROUNDING_MODES)}, got {mode!r}")
        return str(mode)


def dtype_range(dtype: np.dtype) -> tuple[int, int]:
    return INT_RANGES[np.dtype(dtype)]


def byte_lookup(table: np.ndarray, x: np.ndarray, out: np.ndarray) -> Compute:
    """The step writing out = table[x's bytes] for a 256-entry table of an 8-bit input.

    One value (a classifier's score) is looked up in a Python list, indexed by the
    value itself: a negative int8 index counts from the end as its byte does (-1 is
    byte 255). Several: one take, whose mode="clip" skips the default mode's bounds
    check (every byte is in the table), which copies through a buffer on every call."""
    if x.size == 1 and out.size == 1:
        entries = table.tolist()
        read, store = x.reshape(-1).item, out.reshape(-1).__setitem__
        return lambda: store(0, entries[read(0)])
    index, take = x.view(np.uint8), table.take

    def lookup() -> None:
        take(index, out=out, mode="clip")

    return lookup
