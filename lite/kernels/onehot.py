"""OneHot (ONNX semantics): indices -> a one-hot axis of `depth` entries holding values[1]
at each index and values[0] elsewhere.

Negative indices count from the end (-1 is depth - 1); indices outside [-depth, depth)
give an all-off row, as in ONNX. Non-integer indices are truncated to int64 first. Depth and
values must be constants (the output shape is planned when the model loads).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode


class OneHot(Kernel):
    """inputs: indices, depth (scalar), values ([off, on]); attribute axis (default -1)."""

    op = OpCode.ONE_HOT
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        indices = self.input(0)
        if indices.dtype.kind not in "iuf":
            raise self.fail(f"indices must be numeric, got {indices.dtype}")
        depth_value = np.ravel(self.constant(1, "depth"))
        if depth_value.size != 1:
            raise self.fail(f"depth must hold one value, got {depth_value.size}")
        self.depth = int(depth_value[0])
        if self.depth < 1:
            raise self.fail(f"depth must be positive, got {self.depth}")
        values = np.ravel(self.constant(2, "values"))
        if values.size != 2:
            raise self.fail(f"values must hold [off, on], got {values.size} values")
        self.off, self.on = values[0], values[1]
        self.axis = normalize_axis(self, attrs.int("axis", -1), indices.rank + 1)
        shape = list(indices.shape)
        shape.insert(self.axis, self.depth)
        self.output_specs = [TensorSpec(tuple(shape), values.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        indices, out = required(inputs, 0), outputs[0]
        depth, off, on = self.depth, self.off, self.on
        idx = np.empty(indices.shape, np.int64)
        negative = np.empty(idx.shape, np.bool_)
        expanded = np.expand_dims(idx, self.axis)
        positions_shape = [1] * out.ndim
        positions_shape[self.axis] = depth
        positions = np.arange(depth, dtype=np.int64).reshape(positions_shape)
        mask = np.empty(out.shape, np.bool_)

        def compute() -> None:
            np.copyto(idx, indices, casting="unsafe")
            np.less(idx, 0, out=negative)
            np.add(idx, depth, out=idx, where=negative)
            np.equal(expanded, positions, out=mask)
            out.fill(off)
            np.copyto(out, on, where=mask)

        return compute
