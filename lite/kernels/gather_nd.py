"""GATHER_ND (TFLite, TensorFlow and ONNX semantics): slices of params picked by index tuples.

indices has shape (..., k): each row of its last axis indexes the first k axes of params
after `batch_dims` leading axes both share, and the output is
indices.shape[:-1] + params.shape[batch_dims + k:]. With `wrap` (ONNX) a negative index
counts from the end of its axis; without it (TFLite) it is out of range. An index out of
range is an error when the graph runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode


class GatherNd(Kernel):
    """inputs: params, indices (integers, last axis of length k <= rank of params minus
    batch_dims); attributes batch_dims (default 0), wrap (0/1, default 0)."""

    op = OpCode.GATHER_ND
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        params, indices = self.input(0), self.input(1)
        if indices.dtype.kind not in "iu" or indices.rank < 1:
            raise self.fail(f"indices must be integers of rank >= 1, got {indices.dtype}")
        b = attrs.int("batch_dims", 0)
        if not 0 <= b < min(params.rank, indices.rank):
            raise self.fail(f"batch_dims must be in [0, {min(params.rank, indices.rank)}), got {b}")
        if params.shape[:b] != indices.shape[:b]:
            raise self.fail(
                f"the {b} batch axes differ: params {list(params.shape)}, "
                f"indices {list(indices.shape)}"
            )
        k = indices.shape[-1]
        if k > params.rank - b:
            raise self.fail(f"index tuples of {k} axes for params of rank {params.rank} - {b}")
        self.k, self.batch_dims, self.wrap = k, b, bool(attrs.int("wrap", 0))
        shape = indices.shape[:-1] + params.shape[b + k :]
        self.output_specs = [TensorSpec(tuple(shape), params.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        params, indices, out = required(inputs, 0), required(inputs, 1), outputs[0]
        k, b, wrap = self.k, self.batch_dims, self.wrap
        n_batch = int(np.prod(params.shape[:b], dtype=np.int64))
        dims = params.shape[b : b + k]
        bound = np.array(dims, np.int64)
        # One leading batch axis (of size 1 without batch_dims) keeps a single code path.
        flat_params = params.reshape((n_batch, *params.shape[b:]))
        rows = indices.reshape(n_batch, -1, k)
        batch = np.arange(n_batch).reshape(-1, 1)
        flat_out = out.reshape((n_batch, rows.shape[1], *params.shape[b + k :]))
        if k == 1 and n_batch == 1 and rows.size and flat_out.flags.c_contiguous:
            return _bind_take(flat_params[0], rows.reshape(-1), flat_out[0], wrap)

        def compute() -> None:
            picked = rows
            if wrap and rows.size and np.any(rows < 0):
                picked = np.where(rows < 0, rows + bound, rows)
            if picked.size and (np.any(picked < 0) or np.any(picked >= bound)):
                raise InputError(f"GATHER_ND: an index is outside the params' axes {list(dims)}")
            where = (batch, *(picked[..., j] for j in range(k)))
            np.copyto(flat_out, flat_params[where])

        return compute


def _bind_take(params: np.ndarray, index: np.ndarray, out: np.ndarray, wrap: bool) -> Compute:
    """GATHER_ND of one axis and no batch axes: rows of `params` picked by the 1-D `index`
    with np.take, once the index's extremes show it in range (two reductions, where the
    general path builds comparison arrays and an index tuple)."""
    size = params.shape[0]
    lowest, highest, take = np.minimum.reduce, np.maximum.reduce, np.take

    def compute() -> None:
        picked = index
        lo, hi = int(lowest(picked, axis=None)), int(highest(picked, axis=None))
        if wrap and lo < 0:
            picked = np.where(picked < 0, picked + size, picked)
            lo, hi = int(lowest(picked, axis=None)), int(highest(picked, axis=None))
        if lo < 0 or hi >= size:
            raise InputError(f"GATHER_ND: an index is outside the params' axes {[size]}")
        # In range: "clip" changes nothing and skips take's own checks and copy.
        take(params, picked, axis=0, out=out, mode="clip")

    return compute
