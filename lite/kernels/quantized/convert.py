"""QUANTIZE (float -> int8/uint8/int16), DEQUANTIZE (int8/uint8/int16/float16 -> float32)
and REQUANTIZE (between int8/uint8/int16 with new parameters), as TFLite's reference
kernels:

- quantize: q = clamp(round(x / scale) + zero_point), the division in float32, ties
  rounded away from zero (to even with the node attribute rounding="onnx", as
  onnxruntime's QuantizeLinear);
- dequantize: x = float32(scale * (q - zero_point)), the product in float64;
- requantize: q' = clamp(z' + MultiplyByQuantizedMultiplier(q - z, scale / scale')).

Per-axis parameters broadcast along their axis (a per-channel weight can be quantized or
dequantized by the same kernels).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import (
    QUANTIZED_DTYPES,
    QuantizedKernel,
    byte_lookup,
    dtype_range,
)
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.ops import OpCode

_OUT_DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int16": np.dtype(np.int16),  # tfliteq: int16x8 activations
}


def output_dtype(kernel: QuantizedKernel, default: np.dtype) -> np.dtype | None:
    """The `dtype` attribute if given, else the output tensor's declared int8/uint8 dtype,
    else `default`; None for an unknown attribute value."""
    if "dtype" in kernel.attrs.values:
        return _OUT_DTYPES.get(kernel.attrs.str("dtype"))
    declared = kernel.attrs.output_dtypes[0] if kernel.attrs.output_dtypes else None
    return declared if declared in _OUT_DTYPES.values() else np.dtype(default)


def broadcast_params(q: Quantization, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(scale float64, zero_point int64) shaped to broadcast against a rank-`rank` tensor."""
    scale = q.scale.astype(np.float64)
    zp = q.zero_point.astype(np.int64) if q.zero_point.size else np.zeros_like(scale, np.int64)
    if scale.size == 1:
        return scale.reshape(()), zp.reshape(())
    shape = [1] * rank
    shape[q.axis] = scale.size
    return scale.reshape(shape), zp.reshape(shape)


class Quantize(QuantizedKernel):
    """float -> int8/uint8 with the output tensor's parameters."""

    op = OpCode.QUANTIZE

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        dtype = output_dtype(self, np.dtype(np.int8))
        if dtype is None:
            raise self.fail(
                f"dtype must be one of {sorted(_OUT_DTYPES)}, got {attrs.values.get('dtype')!r}"
            )
        oq = self.attrs.output_quant[0] if self.attrs.output_quant else None
        if oq is None:
            raise self.fail("the output needs quantization parameters (the file declares none)")
        if oq.scale.size > 1 and not (0 <= oq.axis < x.rank and x.shape[oq.axis] == oq.scale.size):
            raise self.fail(
                f"{oq.scale.size} scales do not match axis {oq.axis} of input shape {list(x.shape)}"
            )
        scale, zp = broadcast_params(oq, x.rank)
        self.scale, self.zp = scale.astype(np.float32), zp
        self.lo, self.hi = dtype_range(dtype)
        self.output_specs = [self.out_spec(x.shape, dtype, oq)]
        f64 = np.dtype(np.float64)
        self.scratch_layout = [
            (x.shape, np.dtype(np.float32)),
            (x.shape, f64),
            (x.shape, f64),
            (x.shape, np.dtype(np.int32)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        v32, v64, half, whole = self.scratch_arrays()
        scale, zp = self.scale, self.zp
        # Clamping before the truncating cast equals clamping after it (integer bounds).
        low, high = self.lo - zp, self.hi - zp
        divide, copyto, copysign, add, clip = np.divide, np.copyto, np.copysign, np.add, np.clip
        if self.rounding == "onnx":
            rint = np.rint

            def compute_onnx() -> None:
                divide(x, scale, out=v32)  # float32 division, as onnxruntime's QuantizeLinear
                rint(v32, out=v32)  # ties to even
                clip(v32, low, high, out=whole, casting="unsafe")
                add(whole, zp, out=out, casting="unsafe")

            return compute_onnx

        def compute() -> None:
            divide(x, scale, out=v32)  # float32 division, as TFLite
            copyto(v64, v32)
            copysign(0.5, v64, out=half)
            add(v64, half, out=v64)  # ties away from zero once truncated
            clip(v64, low, high, out=whole, casting="unsafe")
            add(whole, zp, out=out, casting="unsafe")

        return compute


class Dequantize(QuantizedKernel):
    """int8/uint8 (with quantization) or float16 -> float32."""

    op = OpCode.DEQUANTIZE

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        self.scale = self.zp = None
        if x.dtype in QUANTIZED_DTYPES or x.dtype in (np.dtype(np.int16), np.dtype(np.int32)):
            if x.quant is None:
                raise self.fail(f"a {x.dtype} input needs quantization parameters")
            self.scale, self.zp = broadcast_params(x.quant, x.rank)
        elif x.dtype.kind != "f":
            raise self.fail(f"input must be int8, uint8, int16, int32 or float, got {x.dtype}")
        self.output_specs = [TensorSpec(x.shape, np.dtype(np.float32))]
        if self.scale is not None:
            self.scratch_layout = [(x.shape, np.dtype(np.float64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        if self.scale is None:
            return lambda: np.copyto(out, x)
        (v64,) = self.scratch_arrays()
        scale, zp, subtract, multiply, copyto = (
            self.scale,
            self.zp,
            np.subtract,
            np.multiply,
            np.copyto,
        )

        def compute() -> None:
            subtract(x, zp, out=v64)
            multiply(v64, scale, out=v64)
            copyto(out, v64, casting="same_kind")

        return compute


def dequantize_array(value: np.ndarray, quant: Quantization | None) -> np.ndarray:
    """A constant's float32 value: float16 widened, int8/uint8 dequantized (weight-only)."""
    if quant is None:
        return np.asarray(value, np.float32)
    scale, zp = broadcast_params(quant, value.ndim)
    if value.dtype.itemsize <= 2 and value.ndim:
        # In float32 throughout, with no int64 or float64 temporaries of the weights' size:
        # q - zp is a small integer (exact in float32), and a float32 product rounds as the
        # float64 one rounded to float32 would.
        # Each pass converts on the fly (a ufunc casts int8 to float32 in its inner loop);
        # symmetric weights (zero points all 0) need only the product.
        out = np.empty(value.shape, np.float32)
        if np.any(zp):
            np.subtract(value, np.asarray(zp, np.float32), out=out)
            np.multiply(out, np.asarray(scale, np.float32), out=out)
        else:
            np.multiply(value, np.asarray(scale, np.float32), out=out)
        return out
    # np.asarray: arithmetic on a 0-d array gives a NumPy scalar, which has no flags.
    return np.asarray((value.astype(np.int64) - zp) * scale, np.float32)


class Requantize(QuantizedKernel):
    """int8/uint8 -> int8/uint8 with the output tensor's parameters."""

    op = OpCode.REQUANTIZE

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        in_scale, in_zp = self.tensor_params(x, "the input")
        dtype = output_dtype(self, x.dtype)
        if dtype is None:
            raise self.fail(
                f"dtype must be one of {sorted(_OUT_DTYPES)}, got {attrs.values.get('dtype')!r}"
            )
        oq = self.output_quant(dtype)
        out_scale, out_zp = self.tensor_params(TensorSpec((), dtype, quant=oq), "the output")
        self.in_zp = np.int64(in_zp)
        self.requant = Requantizer(in_scale / out_scale, out_zp, *dtype_range(dtype))
        self.output_specs = [self.out_spec(x.shape, dtype, oq)]
        self.table: np.ndarray | None = None
        if x.dtype.itemsize == 1:
            # An 8-bit input has 256 values: the fixed-point arithmetic runs once, on all
            # of them, and a call is one lookup by the input's bytes (on the small tensors
            # of streaming models the arithmetic costs ten times more than the lookup).
            q = np.arange(256).astype(np.uint8).view(x.dtype)
            self.table = np.empty(256, dtype)
            self.requant.apply(q.astype(np.int64) - in_zp, self.table)
        else:
            self.scratch_layout = [(x.shape, np.dtype(np.int64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, table = required(inputs, 0), outputs[0], self.table
        if table is not None:
            return byte_lookup(table, x, out)
        (acc,) = self.scratch_arrays()
        zp, requant, subtract = self.in_zp, self.requant, np.subtract

        def compute() -> None:
            subtract(x, zp, out=acc)
            requant.apply(acc, out)

        return compute
