"""CUMSUM (TFLite and TensorFlow semantics): running sums along one axis, optionally
exclusive (each sum leaves out its own element) and reversed (summed from the end)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class CumSum(Kernel):
    """inputs: x, axis (a constant scalar); attributes exclusive, reverse (0 or 1)."""

    op = OpCode.CUMSUM
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype.kind not in "iuf":
            raise self.fail(f"x must be numeric, got {x.dtype}")
        axis = np.ravel(self.constant(1, "axis"))
        if axis.size != 1:
            raise self.fail(f"axis must hold one value, got {axis.size}")
        self.axis = normalize_axis(self, int(axis[0]), x.rank)
        self.exclusive = bool(attrs.int("exclusive", 0))
        self.reverse = bool(attrs.int("reverse", 0))
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis = inputs[0], outputs[0], self.axis
        flip = [slice(None)] * out.ndim
        if self.reverse:
            flip[axis] = slice(None, None, -1)
        src, dst = x[tuple(flip)], out[tuple(flip)]  # type: ignore[index]
        if not self.exclusive:

            def inclusive() -> None:
                np.cumsum(src, axis=axis, out=dst)

            return inclusive
        head = [slice(None)] * out.ndim
        head[axis] = slice(0, 1)
        rest, prefix = list(head), list(head)
        rest[axis], prefix[axis] = slice(1, None), slice(None, -1)
        first, tail, before = tuple(head), tuple(rest), tuple(prefix)

        def compute() -> None:
            dst[first] = 0
            np.cumsum(src[before], axis=axis, out=dst[tail])

        return compute
