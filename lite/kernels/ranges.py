"""Range: the sequence start, start + delta, ... below limit (ONNX Range).

Its length depends on the values of its inputs, so they must be known when the graph is
planned (constants, or shape arithmetic on the planned input shapes); the output is then
known too, and the planner folds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode

MAX_LENGTH = 1 << 28
"""Longest sequence a plan builds (the inputs come from the file or the caller)."""


class Range(Kernel):
    """Inputs: start, limit, delta (scalars of one numeric dtype)."""

    op = OpCode.RANGE
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        names = ("start", "limit", "delta")
        specs = [self.input(k) for k in range(3)]
        dtype = specs[0].dtype
        for name, spec in zip(names, specs, strict=True):
            if spec.dtype != dtype or spec.dtype.kind not in "iuf" or spec.size != 1:
                raise self.fail(
                    f"{name} must be a one-element {dtype} tensor like start, got "
                    f"{spec.dtype}{list(spec.shape)}"
                )
        start, limit, delta = (self.constant(k, n).reshape(()) for k, n in enumerate(names))
        if delta == 0:
            raise self.fail("delta must not be 0")
        count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
        if count > MAX_LENGTH:
            raise self.fail(f"{count:,} elements is more than the {MAX_LENGTH:,} allowed")
        value = (start + np.arange(count, dtype=dtype) * delta).astype(dtype)
        value.flags.writeable = False
        self.value = value
        self.output_specs = [TensorSpec(value.shape, value.dtype, value)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        out, value = outputs[0], self.value
        return lambda: np.copyto(out, value)
