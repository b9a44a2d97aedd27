"""CUMSUM (ONNX CumSum): running sums along an axis, inclusive or exclusive, forward or
reversed. The axis is an input read when the graph is planned (a constant, or a graph input
whose value the planner is given)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class CumSum(Kernel):
    """inputs x, axis (one int); attributes exclusive (0/1), reverse (0/1)."""

    op = OpCode.CUMSUM
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.rank == 0 or x.dtype.kind not in "iuf":
            raise self.fail(f"x must be numeric of rank >= 1, got {x.dtype}{list(x.shape)}")
        axis = np.ravel(self.constant(1, "axis"))
        if axis.size != 1 or axis.dtype.kind not in "iu":
            raise self.fail(f"axis must be one integer, got {axis.dtype}{list(axis.shape)}")
        self.axis = normalize_axis(self, int(axis[0]), x.rank)
        self.exclusive = bool(attrs.int("exclusive", 0))
        self.reverse = bool(attrs.int("reverse", 0))
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = cast(np.ndarray, inputs[0])  # required, checked when prepared
        out = outputs[0]
        axis, exclusive, reverse = self.axis, self.exclusive, self.reverse
        n = x.shape[axis]

        def compute() -> None:
            source = np.flip(x, axis) if reverse else x
            target = np.flip(out, axis) if reverse else out  # a view: sums land in place
            if not exclusive:
                np.cumsum(source, axis=axis, out=target)
                return
            # Exclusive: element i gets the sum of the elements before it (0 first).
            head = [slice(None)] * x.ndim
            head[axis] = slice(0, 1)
            target[tuple(head)] = 0
            if n > 1:
                body, prior = list(head), list(head)
                body[axis], prior[axis] = slice(1, None), slice(0, n - 1)
                np.cumsum(source[tuple(prior)], axis=axis, out=target[tuple(body)])

        return compute
