"""Quantized FullyConnected (x @ W.T + b) and MatMul on int8/uint8 tensors.

The integer products run as float GEMMs over shifted copies of the operands (exact, see
gemm.py); the int32 bias and the requantization follow in int64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import raw
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.linear import matmul_shape
from sporenet.lite.kernels.quantized import conv
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel
from sporenet.lite.kernels.quantized.conv import bias_values, keep_float, shifted_weights
from sporenet.lite.kernels.quantized.fixed_point import Requantizer, WideRequantizer
from sporenet.lite.kernels.quantized.gemm import (
    exact_float_dtype,
    max_abs_shifted,
    split_reduction,
    weight_bound,
)
from sporenet.lite.kernels.quantized.output_stage import Folded, OutputStage, make_stage
from sporenet.lite.kernels.quantized.rounding import OnnxRequantizer, onnx_multipliers
from sporenet.lite.ops import OpCode


def fully_connected_shape(kernel: QuantizedKernel, x: TensorSpec, w: TensorSpec) -> tuple[int, int]:
    """(out, in) features of 2-D weights, checked against the input's last axis."""
    if w.rank != 2:
        raise kernel.fail(f"weights must be 2-D (out, in), got shape {list(w.shape)}")
    o, k = w.shape
    if x.rank < 1 or x.shape[-1] != k:
        raise kernel.fail(
            f"input shape {list(x.shape)} does not end in the weights' in_features {k}"
        )
    return o, k


class QFullyConnected(QuantizedKernel):
    """x (..., K) quantized per tensor, constant w (O, K) per tensor or per output channel,
    optional int32 bias (O,); fused relu/relu6/clip as clamps."""

    op = OpCode.FULLY_CONNECTED
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w = self.quantized_input(0), self.input(1)
        sx, zx = self.tensor_params(x, "the input")
        o, k = fully_connected_shape(self, x, w)
        self.w, scales = shifted_weights(self, w, o)
        bias = bias_values(self, 2, o)
        x_max = max_abs_shifted(x.dtype, zx)
        self.chunks = split_reduction(x_max, self.w)
        oq = self.output_quant(x.dtype)
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        lo, hi = self.fused_clamp(so, zo, x.dtype)
        bound = weight_bound(x_max, self.w, (1,))
        self.stage = make_stage(self.rounding, sx, scales, so, bias, zo, lo, hi, bound, (o,))
        self.zx = zx
        raw_max = max_abs_shifted(x.dtype, 0)
        shape = (*x.shape[:-1], o)
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        f32 = np.dtype(np.float32)
        self.output_specs = [self.out_spec(shape, x.dtype, oq)]
        # One row (a streaming step) folds whenever its float32 weights would be kept.
        weight_limit = 2 * conv.KEEP_FLOAT_BYTES if rows == 1 else conv.FOLD_WEIGHT_BYTES
        small = rows * (k + 1) * 8 <= conv.FOLD_BYTES and o * (k + 1) * 8 <= weight_limit
        stage = self.stage
        self.fold = (
            stage.folded(self.w, zx, raw_max) if small and isinstance(stage, OutputStage) else None
        )
        self.own_columns = False
        if self.fold is not None:  # conv.FOLD_BYTES: one GEMM and the clamp
            self.kept = None
            f64 = np.dtype(np.float64)
            mask = self.fold.mask_shape((rows, o, 1))
            self.own_columns = rows * (k + 1) * 8 <= conv.OWN_COLUMNS_BYTES
            cols = (0, k + 1) if self.own_columns else (rows, k + 1)
            self.scratch_layout = [(cols, f64), ((rows, o), f64), (mask, np.dtype(bool))]
            return
        self.gather_zero = zx
        params = (sx, scales, so, bias, zo, lo, hi, bound)
        raw = conv.raw_input_stage(stage, self.w, params, zx, raw_max, (o,))
        if raw is not None and len(raw[1]) <= len(self.chunks):
            (self.stage, self.chunks), self.gather_zero = raw, 0
        self.kept = keep_float(np.ascontiguousarray(self.w.T))
        self.scratch_layout = [
            ((rows, k), f32),
            ((k, 0 if self.kept is not None else o), f32),
            ((len(self.chunks), rows, o), f32),
            ((rows, o), self.stage.wide_dtype),
            ((rows, o if len(self.chunks) > 1 else 0), np.dtype(np.float64)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        if self.fold is not None:
            return self._bind_folded(self.fold, x, out)
        xf, wt, parts, wide, total = self.scratch_arrays()
        x2, out2 = x.reshape(xf.shape), out.reshape(wide.shape)
        kept = self.kept
        if kept is not None:
            wt = kept
        gemms = [(xf[:, a:b], wt[a:b], parts[i]) for i, (a, b) in enumerate(self.chunks)]
        acc = parts[0] if len(gemms) == 1 else total
        stage = self.stage.bind(acc, out2, wide)
        w_t, many = self.w.T, len(gemms) > 1
        shift = conv.shift_into(x2, xf, self.gather_zero)
        copyto, matmul, add_reduce = raw.copyto, np.matmul, np.add.reduce

        def compute() -> None:
            shift()
            if kept is None:
                copyto(wt, w_t)
            for xa, wa, pa in gemms:
                matmul(xa, wa, out=pa)
            if many:
                add_reduce(parts, axis=0, dtype=np.float64, out=total)
            stage()

        return compute

    def _bind_folded(self, fold: Folded, x: np.ndarray, out: np.ndarray) -> Compute:
        """One float64 GEMM, [x - z_x, 1] @ [w * coef, offset].T, then the clamp
        (output_stage.Folded), as small convolutions run; the column of ones is written
        once when the columns are the kernel's own, else each call (shared scratch)."""
        cols, v, mask = self.scratch_arrays()
        rows, o = v.shape
        k = cols.shape[1] - 1
        if self.own_columns:
            cols = np.empty((rows, k + 1), np.float64)
            cols[:, k] = 1.0
        target, ones, x2 = cols[:, :k], cols[:, k], x.reshape(rows, k)
        weights = fold.weights.T  # BLAS reads the transpose in place
        stage = fold.bind(v.reshape(rows, o, 1), out.reshape(rows, o, 1), mask)
        a, ab = (cols[0], v[0]) if rows == 1 else (cols, v)  # a vector-matrix product
        shift, dot = conv.shift_into(x2, target, fold.zero_point), raw.dot
        fill = None if self.own_columns else ones.fill

        def compute() -> None:
            shift()
            if fill is not None:
                fill(1.0)
            dot(a, weights, out=ab)
            stage()

        return compute


class QMatMul(QuantizedKernel):
    """a @ b with NumPy matmul semantics, both int8/uint8 quantized per tensor (b may be
    a constant quantized per column, axis = its last)."""

    op = OpCode.MATMUL
    num_inputs = (2, 2)

    def requantizer(
        self, reals: np.ndarray | float, zero_point: int, lo: int, hi: int
    ) -> Requantizer | WideRequantizer:
        """The output stage: TFLite's int32 MultiplyByQuantizedMultiplier."""
        return Requantizer(reals, zero_point, lo, hi)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.quantized_input(0), self.quantized_input(1)
        sa, za = self.tensor_params(a, "input 0")
        shape = matmul_shape(a.shape, b.shape)
        if shape is None or a.rank == 0 or b.rank == 0:
            raise self.fail(f"shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied")
        bq = b.quant
        zb = bq.zero_point.astype(np.int64) if bq.zero_point.size else np.zeros(1, np.int64)
        if bq.scale.size > 1 and (
            b.rank < 2 or bq.axis != b.rank - 1 or bq.scale.size != b.shape[-1]
        ):
            raise self.fail(
                f"input 1 may be quantized per column only (axis {b.rank - 1}, "
                f"{b.shape[-1]} scales), got {bq.scale.size} on axis {bq.axis}"
            )
        k = a.shape[-1]
        bound = (
            max_abs_shifted(a.dtype, za)
            * int(np.abs(np.array([max_abs_shifted(b.dtype, int(z)) for z in np.ravel(zb)])).max())
            * k
        )
        ftype = exact_float_dtype(bound)
        oq = self.output_quant(a.dtype)
        so, zo = self.tensor_params(TensorSpec((), a.dtype, quant=oq), "the output")
        lo, hi = self.fused_clamp(so, zo, a.dtype)
        self.requant: Requantizer | WideRequantizer | OnnxRequantizer
        if self.rounding == "onnx":
            self.requant = OnnxRequantizer(
                onnx_multipliers(sa, bq.scale if bq.scale.size > 1 else bq.scale[0], so),
                zo,
                lo,
                hi,
            )
        else:
            self.requant = self.requantizer(
                sa * bq.scale.astype(np.float64) / so
                if bq.scale.size > 1
                else sa * float(bq.scale[0]) / so,
                zo,
                lo,
                hi,
            )
        self.za = ftype.type(za)
        self.zb = zb.astype(ftype) if zb.size > 1 else ftype.type(zb[0])
        self.output_specs = [self.out_spec(tuple(shape), a.dtype, oq)]
        self.scratch_layout = [
            (a.shape, ftype),
            (b.shape, ftype),
            (tuple(shape), ftype),
            (tuple(shape), np.dtype(np.int64)),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out = inputs[0], inputs[1], outputs[0]
        af, bf, accf, acc = self.scratch_arrays()
        za, zb, requant = self.za, self.zb, self.requant
        copyto, subtract, matmul = raw.copyto, np.subtract, np.matmul

        def compute() -> None:
            subtract(a, za, out=af)
            subtract(b, zb, out=bf)
            matmul(af, bf, out=accf)
            copyto(acc, accf, casting="unsafe")
            requant.apply(acc, out)

        return compute


class QMatMul16(QMatMul):
    """int16 BATCH_MATMUL (both operands int16): int64 sums, TFLite's int64
    requantization with the 16-bit reduced multiplier."""

    accepts = INT16_DTYPES

    def requantizer(
        self, reals: np.ndarray | float, zero_point: int, lo: int, hi: int
    ) -> Requantizer | WideRequantizer:
        return WideRequantizer(reals, zero_point, lo, hi, reduced=True)
