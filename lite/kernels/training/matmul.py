"""MATMUL_TRANSPOSED: batched matmul of inputs whose last two axes may be swapped first.

The gradients of FullyConnected and MatMul are products with a transposed operand; NumPy
multiplies a transposed view without copying it, so a separate Transpose node would only
add a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.linear import matmul_shape
from sporenet.lite.ops import OpCode


def _swap(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2])


class MatMulTransposed(Kernel):
    """out = op(a) @ op(b), op swapping the last two axes when transpose_a / transpose_b."""

    op = OpCode.MATMUL_TRANSPOSED
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        a, b = self.require_float(0), self.require_float(1)
        if a.dtype != b.dtype:
            raise self.fail(f"inputs must share a dtype, got {a.dtype} and {b.dtype}")
        if a.rank < 2 or b.rank < 2:
            raise self.fail(f"inputs must have rank >= 2, got {list(a.shape)} and {list(b.shape)}")
        self.ta = bool(attrs.int("transpose_a", 0))
        self.tb = bool(attrs.int("transpose_b", 0))
        sa = _swap(a.shape) if self.ta else a.shape
        sb = _swap(b.shape) if self.tb else b.shape
        shape = matmul_shape(sa, sb)
        if shape is None:
            raise self.fail(
                f"shapes {list(sa)} and {list(sb)} (after transposes) cannot be multiplied"
            )
        self.output_specs = [TensorSpec(shape, a.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        a, b, out = inputs[0], inputs[1], outputs[0]
        a = np.swapaxes(a, -1, -2) if self.ta else a
        b = np.swapaxes(b, -1, -2) if self.tb else b
        return lambda: np.matmul(a, b, out=out)
