"""GATHER_ND (TFLite and TensorFlow semantics): slices of params picked by index tuples.

indices has shape (..., k): each row of its last axis indexes the first k axes of params,
and the output is indices.shape[:-1] + params.shape[k:]. An index out of range is an
error when the graph runs, as in TFLite.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class GatherNd(Kernel):
    """inputs: params, indices (integers, last axis of length k <= rank of params)."""

    op = OpCode.GATHER_ND
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        params, indices = self.input(0), self.input(1)
        if indices.dtype.kind not in "iu" or indices.rank < 1:
            raise self.fail(f"indices must be integers of rank >= 1, got {indices.dtype}")
        k = indices.shape[-1]
        if k > params.rank:
            raise self.fail(f"index tuples of {k} axes for params of rank {params.rank}")
        self.k = k
        shape = indices.shape[:-1] + params.shape[k:]
        self.output_specs = [TensorSpec(tuple(shape), params.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        params, indices, out = inputs[0], inputs[1], outputs[0]
        k, dims = self.k, params.shape[: self.k]  # type: ignore[union-attr]
        bound = np.array(dims, np.int64)
        rows = indices.reshape(-1, k)  # type: ignore[union-attr]
        flat_out = out.reshape((rows.shape[0], *params.shape[k:]))  # type: ignore[union-attr, arg-type]

        def compute() -> None:
            if rows.size and (np.any(rows < 0) or np.any(rows >= bound)):
                raise InputError(f"GATHER_ND: an index is outside the params' axes {list(dims)}")
            np.copyto(flat_out, params[tuple(rows.T)])  # type: ignore[index]

        return compute
