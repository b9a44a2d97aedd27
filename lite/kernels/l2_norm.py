"""L2_NORMALIZATION (TFLite's): x / max(||x||, 1e-6) along one axis, float; the int8 form
is lite/kernels/quantized/l2_norm.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode

EPSILON = 1e-6


class L2Normalization(Kernel):
    """Attribute axis (default -1)."""

    op = OpCode.L2_NORMALIZATION

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        self.axis = normalize_axis(self, attrs.int("axis", -1), max(x.rank, 1))
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        out, axis = outputs[0], self.axis

        def compute() -> None:
            norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
            np.divide(x, np.maximum(norm, x.dtype.type(EPSILON)), out=out)

        return compute
