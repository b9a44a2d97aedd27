"""What every quantized kernel shares: reading quantization parameters at prepare time,
the output quantization the file declares, and the plan's shared scratch buffer.

Scratch: a quantized kernel lists the temporary arrays its step needs (`scratch_layout`);
the planner allocates one buffer as large as the largest kernel's need and hands it to
every kernel before `bind`. Steps run one after another, so they can all use the same
bytes: float copies of int8 weights and the float/int64 accumulators live there instead
of once per layer. A kernel bound without a plan (constant folding) gets its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.base import Attrs, Kernel, TensorSpec
from sporenet.lite.kernels.quantized.fixed_point import INT_RANGES, activation_range
from sporenet.lite.kernels.quantized.rounding import ROUNDING_MODES

QUANTIZED_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))
_ALIGN = 64


def is_quantized(spec: TensorSpec | None) -> bool:
    """An int8/uint8 tensor carrying quantization parameters (dispatches to these kernels)."""
    return spec is not None and spec.dtype in QUANTIZED_DTYPES and spec.quant is not None


def per_tensor(quant: Quantization) -> bool:
    return quant.scale.size == 1


class QuantizedKernel(Kernel):
    """Base class of the int8/uint8 kernels."""

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.scratch_layout: list[tuple[tuple[int, ...], np.dtype]] = []
        self.scratch: np.ndarray | None = None

    # ---- quantization parameters
    def quantized_input(self, index: int) -> TensorSpec:
        spec = self.input(index)
        if not is_quantized(spec):
            missing = " without quantization" if spec.quant is None else ""
            raise self.fail(
                f"input {index} must be an int8/uint8 tensor with quantization, "
                f"got {spec.dtype}{missing}"
            )
        return spec

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
        if name not in ("none", "relu", "relu6", "clip"):
            raise self.fail(f"fused activation {name!r} has no int8 form (none, relu, relu6, clip)")
        return activation_range(name, scale, zero_point, dtype, self.attrs.values)

    @property
    def rounding(self) -> str:
        """The node's requantization mode (`rounding` attribute): "tflite" or "onnx"."""
        mode = self.attrs.values.get("rounding", "tflite")
        if mode not in ROUNDING_MODES:
            raise self.fail(f"rounding must be one of {list(ROUNDING_MODES)}, got {mode!r}")
        return str(mode)

    # ---- scratch
    @property
    def scratch_bytes(self) -> int:
        return sum(_aligned(_nbytes(s, d)) for s, d in self.scratch_layout)

    def scratch_arrays(self) -> list[np.ndarray]:
        """The arrays of `scratch_layout`, carved from the plan's shared scratch."""
        buf = self.scratch
        if buf is None or buf.nbytes < self.scratch_bytes:
            buf = np.empty(max(self.scratch_bytes, 1), np.uint8)
        arrays, at = [], 0
        for shape, dtype in self.scratch_layout:
            n = _nbytes(shape, dtype)
            arrays.append(buf[at : at + n].view(dtype).reshape(shape))
            at += _aligned(n)
        return arrays


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def dtype_range(dtype: np.dtype) -> tuple[int, int]:
    return INT_RANGES[np.dtype(dtype)]
