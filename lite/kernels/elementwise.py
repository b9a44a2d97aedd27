"""Binary elementwise kernels with NumPy broadcasting: Add, Sub, Mul, Div, Maximum, Minimum, ..."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.activation import fused_activation
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class BinaryKernel(Kernel):
    """out = ufunc(a, b) with broadcasting; both inputs share one dtype."""

    ufunc: ClassVar[np.ufunc]
    num_inputs = (2, 2)
    result_dtype: ClassVar[np.dtype | None] = None  # comparisons produce bool

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.input(0), self.input(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs must share a dtype, got {a.dtype} and {b.dtype}")
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise self.fail(
                f"shapes {list(a.shape)} and {list(b.shape)} do not broadcast"
            ) from None
        self.output_specs = [TensorSpec(tuple(shape), self.result_dtype or a.dtype)]
        self.activation = fused_activation(self.op.name, attrs.values)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out, f, act = inputs[0], inputs[1], outputs[0], self.ufunc, self.activation
        if act is None:
            return lambda: f(a, b, out=out)

        def compute() -> None:
            f(a, b, out=out)
            act(out)

        return compute


class Add(BinaryKernel):
    op = OpCode.ADD
    ufunc = np.add


class Sub(BinaryKernel):
    op = OpCode.SUB
    ufunc = np.subtract


class Mul(BinaryKernel):
    op = OpCode.MUL
    ufunc = np.multiply


class Div(BinaryKernel):
    """Float division; integer division truncates toward zero (C and ONNX semantics)."""

    op = OpCode.DIV
    ufunc = np.divide

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        if self.output_specs[0].dtype.kind == "f":
            return super().bind(inputs, outputs)
        a, b, out = inputs[0], inputs[1], outputs[0]

        def compute() -> None:
            np.copyto(out, np.trunc(np.divide(a, b)).astype(out.dtype, copy=False))

        return compute


class Maximum(BinaryKernel):
    op = OpCode.MAXIMUM
    ufunc = np.maximum


class Minimum(BinaryKernel):
    op = OpCode.MINIMUM
    ufunc = np.minimum


class Pow(BinaryKernel):
    op = OpCode.POW
    ufunc = np.power


class Equal(BinaryKernel):
    op = OpCode.EQUAL
    ufunc = np.equal
    result_dtype = np.dtype(np.bool_)


class Greater(BinaryKernel):
    op = OpCode.GREATER
    ufunc = np.greater
    result_dtype = np.dtype(np.bool_)


class Less(BinaryKernel):
    op = OpCode.LESS
    ufunc = np.less
    result_dtype = np.dtype(np.bool_)
