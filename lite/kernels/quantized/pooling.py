"""Quantized pooling on NCHW int8/uint8 tensors, output parameters equal to the input's
(as TFLite requires):

- MaxPool: the float kernel's window reduction on the integers, padding never wins;
- AvgPool: TFLite's integer average: the sum of the raw q over the window's valid
  elements divided by their count, rounding half away from zero; with count_include_pad
  the padding counts too, as the zero point (a real zero);
- GlobalAveragePool: sum of (q - z) over the plane requantized by s_in / (s_out * H*W).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import pooling
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel, dtype_range
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.kernels.quantized.rounding import OnnxRequantizer
from sporenet.lite.kernels.spatial import padded_buffer
from sporenet.lite.ops import OpCode


def _same_params(kernel: QuantizedKernel) -> TensorSpec:
    x = kernel.quantized_input(0)
    kernel.tensor_params(x, "the input")
    oq = kernel.attrs.output_quant[0] if kernel.attrs.output_quant else None
    if oq is not None and (
        oq.scale.size != 1
        or float(oq.scale[0]) != float(x.quant.scale[0])
        or int(oq.zero_point.flat[0] if oq.zero_point.size else 0)
        != int(x.quant.zero_point.flat[0] if x.quant.zero_point.size else 0)
    ):
        raise kernel.fail("output quantization must equal the input's for pooling")
    return x


class _Float32Spec:
    """Prepare the float pooling kernel's geometry on a float spec of the same shape."""

    @staticmethod
    def of(x: TensorSpec) -> list[TensorSpec]:
        return [TensorSpec(x.shape, np.dtype(np.float32))]


class QMaxPool2D(QuantizedKernel):
    op = OpCode.MAX_POOL2D

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = _same_params(self)
        self.inner = pooling.MaxPool2D(attrs, _Float32Spec.of(x))
        shape = self.inner.output_specs[0].shape
        self.output_specs = [self.out_spec(shape, x.dtype, self.quantization(x, "the input"))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        lo, _ = dtype_range(x.dtype)
        inner = self.inner
        inner.fill = lo  # padding never wins the max
        return inner._bind_reduce(x, outputs[0])


class QAvgPool2D(QuantizedKernel):
    op = OpCode.AVG_POOL2D

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = _same_params(self)
        self.inner = pooling.AvgPool2D(attrs, _Float32Spec.of(x))
        win = self.inner.win
        include = bool(attrs.int("count_include_pad", 0))
        counts = [
            pooling._window_counts(win, axis, x.shape[2 + axis], include) for axis in range(2)
        ]
        self.count = np.outer(counts[0], counts[1]).astype(np.int64)
        sx, zx = self.tensor_params(x, "the input")
        self.fill = zx if include else 0
        self.lo, self.hi = self.fused_clamp(sx, zx, x.dtype)
        shape = self.inner.output_specs[0].shape
        self.output_specs = [self.out_spec(shape, x.dtype, self.quantization(x, "the input"))]
        self.scratch_layout = [(x.shape, np.dtype(np.int64)), (shape, np.dtype(np.int64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        x64, acc = self.scratch_arrays()
        win = self.inner.win
        # Padding holds the zero point when it counts, else 0 (adds nothing to the sum).
        xp, interior = (
            padded_buffer(x64, win, self.fill)
            if win.padded or any(e > s for e, s in zip(win.extent, x.shape[2:], strict=True))
            else (x64, x64)
        )
        taps = [
            xp[(..., *win.tap(i, j))] for i in range(win.kernel[0]) for j in range(win.kernel[1])
        ]
        count, half, lo, hi = self.count, self.count // 2, self.lo, self.hi
        add, copyto = np.add, np.copyto
        neg = np.empty(acc.shape, bool)

        def compute() -> None:
            copyto(interior, x)
            copyto(acc, taps[0])
            for tap in taps[1:]:
                add(acc, tap, out=acc)
            # C division truncates: (acc +- count/2) / count, the sign of acc choosing.
            np.less(acc, 0, out=neg)
            np.abs(acc, out=acc)
            np.add(acc, half, out=acc)
            np.floor_divide(acc, count, out=acc)
            np.negative(acc, out=acc, where=neg)
            np.clip(acc, lo, hi, out=acc)
            copyto(out, acc, casting="unsafe")

        return compute


class QGlobalAvgPool(QuantizedKernel):
    op = OpCode.GLOBAL_AVG_POOL

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, zx = self.tensor_params(x, "the input")
        if x.rank < 3 or x.size == 0:
            raise self.fail(f"input must be a non-empty (N, C, spatial...), got {list(x.shape)}")
        oq = self.output_quant(x.dtype)
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        n, c = x.shape[:2]
        plane = x.size // (n * c)
        self.zx_sum = np.int64(zx * plane)
        clamp = self.fused_clamp(so, zo, x.dtype)
        self.requant: Requantizer | OnnxRequantizer
        if self.rounding == "onnx":
            # onnxruntime's QLinearGlobalAveragePool: s_in / plane / s_out in float32.
            m = np.float32(np.float32(sx) / np.float32(plane)) / np.float32(so)
            self.requant = OnnxRequantizer(np.float32(m), zo, *clamp)
        else:
            self.requant = Requantizer(sx / (so * plane), zo, *clamp)
        self.output_specs = [self.out_spec((n, c, *[1] * (x.rank - 2)), x.dtype, oq)]
        # Sums of a plane below 2^24 are exact as a float32 matrix-vector product, which
        # beats a reduction over short rows (3x3 planes of 1280 channels).
        self.exact = 256 * plane < (1 << 24)
        f32 = np.dtype(np.float32)
        self.scratch_layout = [((n, c), np.dtype(np.int64)), ((n, c, plane), f32), ((n, c), f32)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        acc, xf, sums = self.scratch_arrays()
        n, c = acc.shape
        x3, out2, bias, requant = x.reshape(n, c, -1), out.reshape(n, c), self.zx_sum, self.requant
        ones = np.ones(x3.shape[2], np.float32)
        copyto, matmul, subtract, exact = np.copyto, np.matmul, np.subtract, self.exact

        def compute() -> None:
            if exact:
                copyto(xf, x3)
                matmul(xf, ones, out=sums)
                copyto(acc, sums, casting="unsafe")
            else:
                np.sum(x3, axis=2, dtype=np.int64, out=acc)
            subtract(acc, bias, out=acc)
            requant.apply(acc, out2)

        return compute
