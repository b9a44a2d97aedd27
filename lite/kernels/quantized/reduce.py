"""Quantized reductions with TFLite's reference integer semantics (reduce.h):

- MEAN and SUM: the int32 sum of q over the axes, less n * z_in, requantized by
  s_in / s_out as MultiplyByQuantizedMultiplier; for MEAN the 1/n is folded into the
  multiplier as TFLite does (M' = (M << k) / n, shift' = shift - k with k = floor(log2 n),
  at most 32 and at most 31 + shift);
- MAX and MIN: the float kernels' reductions on the integers, output parameters equal to
  the input's (as TFLite requires).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels import reduce
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.base import QuantizedKernel, dtype_range
from sporenet.lite.kernels.quantized.fixed_point import Requantizer, quantize_multiplier
from sporenet.lite.ops import OpCode


def _axes_shape(kernel: QuantizedKernel, x: TensorSpec) -> reduce.ReduceSum:
    """The float ReduceSum of x's shape: axes, keepdims and the output shape."""
    return reduce.ReduceSum(
        kernel.attrs, [TensorSpec(x.shape, np.dtype(np.float32)), *kernel.inputs[1:]]
    )


def mean_multiplier(m: int, shift: int, n: int) -> tuple[int, int]:
    """TFLite's rescaling of a sum into a mean of n elements, folded into (M, shift)."""
    k = min(n.bit_length() - 1, 32, 31 + shift)
    return (m << k) // n if k >= 0 else m // n, shift - k


class _QSumOrMean(QuantizedKernel):
    mean: ClassVar[bool]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        sx, self.zx = self.tensor_params(x, "the input")
        oq = self.output_quant(x.dtype)
        so, zo = self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output")
        shape = _axes_shape(self, x)
        self.identity = shape.identity
        self.axes, self.keepdims = (() if shape.identity else shape.axes), shape.keepdims
        self.n = int(np.prod([x.shape[a] for a in self.axes], dtype=np.int64))
        m, shift = quantize_multiplier(sx / so)
        if self.mean and self.n > 0:
            m, shift = mean_multiplier(m, shift, self.n)
        self.requant = Requantizer(0.0, zo, *dtype_range(x.dtype), fixed=(m, shift))
        out = shape.output_specs[0].shape
        self.output_specs = [self.out_spec(out, x.dtype, oq)]
        self.scratch_layout = [(out, np.dtype(np.int64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        (acc,) = self.scratch_arrays()
        axes, keepdims, bias, requant = self.axes, self.keepdims, self.zx * self.n, self.requant
        if self.identity or not axes:
            axes = ()

        def compute() -> None:
            np.sum(x, axis=axes, dtype=np.int64, keepdims=keepdims, out=acc)
            np.subtract(acc, bias, out=acc)
            requant.apply(acc, out)

        return compute


class QReduceMean(_QSumOrMean):
    op = OpCode.REDUCE_MEAN
    mean = True


class QReduceSum(_QSumOrMean):
    op = OpCode.REDUCE_SUM
    mean = False


class _QExtreme(QuantizedKernel):
    base: ClassVar[type[reduce.ReduceKernel]]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.quantized_input(0)
        params = self.tensor_params(x, "the input")
        oq = attrs.output_quant[0] if attrs.output_quant else None
        if (
            oq is not None
            and self.tensor_params(TensorSpec((), x.dtype, quant=oq), "the output") != params
        ):
            raise self.fail("output quantization must equal the input's")
        self.inner = self.base(attrs, inputs)
        spec = self.inner.output_specs[0]
        quant = self.quantization(x, "the input")
        self.output_specs = [self.out_spec(spec.shape, x.dtype, quant)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute | None:
        return self.inner.bind(inputs, outputs)


class QReduceMax(_QExtreme):
    op = OpCode.REDUCE_MAX
    base = reduce.ReduceMax


class QReduceMin(_QExtreme):
    op = OpCode.REDUCE_MIN
    base = reduce.ReduceMin
