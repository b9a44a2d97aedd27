"""SCATTER_ND (TFLite and TensorFlow semantics): zeros of a given shape with updates added
at index tuples; duplicates add up. An index out of range is an error when the graph runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode

MAX_ELEMENTS = 1 << 28
"""Largest output (elements) a constant shape may ask for."""


class ScatterNd(Kernel):
    """inputs: indices (integers [..., k]), updates ([...] + shape[k:]), shape (constant)."""

    op = OpCode.SCATTER_ND
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        indices, updates = self.input(0), self.input(1)
        shape = tuple(int(d) for d in np.ravel(self.constant(2, "shape")))
        if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
            raise self.fail(f"shape {list(shape)} is negative or too large")
        if indices.dtype.kind not in "iu" or indices.rank < 1:
            raise self.fail(f"indices must be integers of rank >= 1, got {indices.dtype}")
        k = indices.shape[-1]
        want = indices.shape[:-1] + shape[k:]
        if k > len(shape) or updates.shape != want:
            raise self.fail(
                f"updates {list(updates.shape)} must be {list(want)} for indices "
                f"{list(indices.shape)} into shape {list(shape)}"
            )
        self.k = k
        self.output_specs = [TensorSpec(shape, updates.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        indices, updates, out, k = required(inputs, 0), required(inputs, 1), outputs[0], self.k
        dims = np.array(out.shape[:k], np.int64)
        rows = indices.reshape(-1, k)
        flat = updates.reshape((rows.shape[0], *out.shape[k:]))

        def compute() -> None:
            if rows.size and (np.any(rows < 0) or np.any(rows >= dims)):
                raise InputError(f"SCATTER_ND: an index is outside the shape {list(out.shape)}")
            out.fill(0)
            np.add.at(out, tuple(rows.T), flat)

        return compute
