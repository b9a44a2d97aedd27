"""ONNX's scatters, SCATTER_ND_UPDATE and SCATTER_ELEMENTS: a copy of data with updates
written at indexed positions, either replacing the element (reduction "none": of duplicate
positions the last update wins, as ONNX's reference does) or combined with it ("add",
"mul", "max", "min", every duplicate counted). A negative index counts from the end of its
axis; one out of range is an error when the graph runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode

Writer = Callable[[np.ndarray, tuple[np.ndarray, ...], np.ndarray], None]


def _assign(out: np.ndarray, where: tuple[np.ndarray, ...], values: np.ndarray) -> None:
    out[where] = values


REDUCTIONS: dict[str, Writer] = {
    "none": _assign,
    "add": np.add.at,
    "mul": np.multiply.at,
    "max": np.maximum.at,
    "min": np.minimum.at,
}
"""How an update meets the element at its position, by ONNX's `reduction` name."""


def _writer(kernel: Kernel, attrs: Attrs) -> Writer:
    reduction = attrs.str("reduction", "none")
    if reduction not in REDUCTIONS:
        raise kernel.fail(f"reduction must be one of {sorted(REDUCTIONS)}, got {reduction!r}")
    return REDUCTIONS[reduction]


_lowest, _highest = np.minimum.reduce, np.maximum.reduce


def _wrapped(index: np.ndarray, bound: np.ndarray, op: str, shape: Sequence[int]) -> np.ndarray:
    """index with negatives counted from the end; InputError when one stays out of range.
    One bound for all (a scalar): the check is the index's extremes, two reductions with
    no temporary, where comparisons make two boolean arrays and scan each."""
    if index.size and bound.ndim == 0:
        lo, hi = int(_lowest(index, axis=None)), int(_highest(index, axis=None))
        if lo >= 0 and hi < bound:
            return index
    if index.size and np.any(index < 0):
        index = np.where(index < 0, index + bound, index)
    if index.size and (np.any(index < 0) or np.any(index >= bound)):
        raise InputError(f"{op}: an index is outside the data's shape {list(shape)}")
    return index


def _element_axis(kernel: Kernel, attrs: Attrs, data: TensorSpec, indices: TensorSpec) -> int:
    """The `axis` of an element gather or scatter, once indices fit data on every other axis."""
    axis = normalize_axis(kernel, attrs.int("axis", 0), data.rank)
    pairs = zip(indices.shape, data.shape, strict=True)
    if any(i > d for a, (i, d) in enumerate(pairs) if a != axis):
        raise kernel.fail(
            f"indices {list(indices.shape)} are longer than data {list(data.shape)} off axis {axis}"
        )
    return axis


class ScatterNdUpdate(Kernel):
    """inputs: data, indices (integers [..., k]), updates (indices.shape[:-1] +
    data.shape[k:]); attribute reduction (default "none")."""

    op = OpCode.SCATTER_ND_UPDATE
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        data, indices, updates = self.input(0), self.input(1), self.input(2)
        if indices.dtype.kind not in "iu" or indices.rank < 1:
            raise self.fail(f"indices must be integers of rank >= 1, got {indices.dtype}")
        k = indices.shape[-1]
        want = indices.shape[:-1] + data.shape[k:]
        if k > data.rank or updates.shape != want:
            raise self.fail(
                f"updates {list(updates.shape)} must be {list(want)} for indices "
                f"{list(indices.shape)} into data {list(data.shape)}"
            )
        self.k, self.write = k, _writer(self, attrs)
        self.reduction = attrs.str("reduction", "none")
        self.output_specs = [TensorSpec(data.shape, data.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        data, indices, updates = (required(inputs, i) for i in range(3))
        out, k = outputs[0], self.k
        if k == 1 and out.ndim >= 1 and indices.size and out.flags.c_contiguous:
            return _bind_rows(data, indices.reshape(-1), updates, out, self.reduction)
        bound = np.array(out.shape[:k], np.int64)
        rows = indices.reshape(-1, k)
        flat = updates.reshape((rows.shape[0], *out.shape[k:]))
        write = self.write

        def compute() -> None:
            picked = _wrapped(rows, bound, "SCATTER_ND_UPDATE", out.shape)
            np.copyto(out, data)
            write(out, tuple(picked.T), flat)

        return compute


ONE_HOT_ENTRIES = 1 << 14
"""A float row scatter-add of up to this many (row, update) pairs runs as one product
with a one-hot [rows, updates] matrix (BLAS, a few calls); beyond, its multiply-adds grow
past those of np.add.at on the rows' element positions."""


def _bind_rows(
    data: np.ndarray, index: np.ndarray, updates: np.ndarray, out: np.ndarray, reduction: str
) -> Compute:
    """SCATTER_ND_UPDATE of one index axis: whole rows of `out` (a copy of data) replaced
    or combined with the rows of updates. The check is on the E indices alone. Every
    reduction can run through the flattened positions, where ufunc.at takes its fast path;
    "add" of finite float rows is a one-hot product while small (ONE_HOT_ENTRIES)."""
    n, e = out.shape[0], index.size
    bound = np.array(n, np.int64)
    width = int(np.prod(out.shape[1:], dtype=np.int64))
    out2, rows = out.reshape(n, width), updates.reshape(e, width)
    copyto = np.copyto
    write, flat = REDUCTIONS[reduction], out.reshape(-1)
    offsets = np.arange(width, dtype=np.int64)
    flat_updates = rows.reshape(-1)

    def combined() -> None:
        at = _wrapped(index, bound, "SCATTER_ND_UPDATE", out.shape).astype(np.int64, copy=False)
        copyto(out, data)
        if reduction == "none":
            out2[at] = rows  # of duplicate rows the last wins, as numpy assigns in order
        else:
            write(flat, (np.add.outer(at * width, offsets).reshape(-1),), flat_updates)

    if reduction != "add" or out.dtype.kind != "f" or n * e > ONE_HOT_ENTRIES:
        return combined
    one_hot = np.zeros((n, e), out.dtype)
    columns = np.arange(e)
    product = temporary((n, width), out.dtype)  # written before it is read, every call
    data2 = data.reshape(n, width)
    dot, add, total = np.dot, np.add, np.add.reduce

    def summed() -> None:
        # An infinite or NaN update would spread through the product's zeros (0 * inf):
        # such rows take the positions' path. Their sum is not finite whenever one is.
        if not math.isfinite(total(flat_updates, axis=None)):
            combined()
            return
        at = _wrapped(index, bound, "SCATTER_ND_UPDATE", out.shape)
        one_hot.fill(0)
        one_hot[at, columns] = 1
        dot(one_hot, rows, out=product)
        add(data2, product, out=out2)

    return summed


class ScatterElements(Kernel):
    """inputs: data, indices (integers of data's rank), updates (indices' shape);
    attributes axis (default 0), reduction (default "none"). Position p of updates goes to
    p with its `axis` coordinate replaced by indices[p]."""

    op = OpCode.SCATTER_ELEMENTS
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        data, indices, updates = self.input(0), self.input(1), self.input(2)
        if indices.dtype.kind not in "iu" or indices.rank != data.rank:
            raise self.fail(
                f"indices must be integers of the data's rank {data.rank}, got "
                f"{indices.dtype} of rank {indices.rank}"
            )
        if updates.shape != indices.shape:
            raise self.fail(
                f"updates {list(updates.shape)} must have the indices' shape {list(indices.shape)}"
            )
        self.axis = _element_axis(self, attrs, data, indices)
        self.write = _writer(self, attrs)
        self.output_specs = [TensorSpec(data.shape, data.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        data, indices, updates = (required(inputs, i) for i in range(3))
        out, axis = outputs[0], self.axis
        grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
        bound = np.array(out.shape[axis], np.int64)
        write = self.write
        if out.flags.c_contiguous:
            return self._bind_flat(data, indices, updates, out, grid)

        def compute() -> None:
            grid[axis] = _wrapped(indices, bound, "SCATTER_ELEMENTS", out.shape)
            np.copyto(out, data)
            write(out, tuple(grid), updates)

        return compute

    def _bind_flat(
        self,
        data: np.ndarray,
        indices: np.ndarray,
        updates: np.ndarray,
        out: np.ndarray,
        grid: list[np.ndarray],
    ) -> Compute:
        """The scatter through positions in the flattened output: ufunc.at takes its fast
        path only for one 1-D index (ten times the tuple of broadcast grids, on a graph
        network's message sums), and applies the updates in the same order."""
        axis, write, flat = self.axis, self.write, out.reshape(-1)
        bound = np.array(out.shape[axis], np.int64)
        stride = int(np.prod(out.shape[axis + 1 :], dtype=np.int64))
        grid[axis] = np.zeros((1,) * indices.ndim, np.int64)
        base = np.ravel_multi_index(tuple(np.broadcast_arrays(*grid)), out.shape)
        base = np.broadcast_to(base, indices.shape).astype(np.int64).reshape(-1)
        multiply, add = np.multiply, np.add

        def compute() -> None:
            at = _wrapped(indices, bound, "SCATTER_ELEMENTS", out.shape).astype(
                np.int64, copy=False
            )
            np.copyto(out, data)
            write(flat, (add(base, multiply(at.reshape(-1), stride)),), updates.reshape(-1))

        return compute


class GatherElements(Kernel):
    """inputs: data, indices (integers of data's rank, no longer than data off `axis`);
    attribute axis (default 0). out[p] = data[p with its `axis` coordinate replaced by
    indices[p]]."""

    op = OpCode.GATHER_ELEMENTS
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        data, indices = self.input(0), self.input(1)
        if indices.dtype.kind not in "iu" or indices.rank != data.rank:
            raise self.fail(
                f"indices must be integers of the data's rank {data.rank}, got "
                f"{indices.dtype} of rank {indices.rank}"
            )
        self.axis = _element_axis(self, attrs, data, indices)
        self.output_specs = [TensorSpec(indices.shape, data.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        data, indices = required(inputs, 0), required(inputs, 1)
        out, axis = outputs[0], self.axis
        grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
        bound = np.array(data.shape[axis], np.int64)

        def compute() -> None:
            grid[axis] = _wrapped(indices, bound, "GATHER_ELEMENTS", data.shape)
            np.copyto(out, data[tuple(grid)])

        return compute
