"""TFLite's sparse tensors (a TACO-style format) expanded to dense arrays at conversion.

A sparse tensor lists its dimensions in `traversal_order` (the original n dimensions, then
k block dimensions, each mapped to an original one by `block_map`); each traversed
dimension is DENSE (a size) or SPARSE_CSR (segments and indices, as CSR's row pointers and
column indices). The buffer holds the stored values in traversal order. The expansion walks
the levels with whole arrays (no per-element Python loop) and checks every segment and
index against the sizes, so a malformed file raises InvalidTfliteError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sporenet.proto import tflite_schema_generated as tfl

_VECTORS = {
    tfl.SparseIndexVector.Int32Vector: tfl.Int32Vector,
    tfl.SparseIndexVector.Uint16Vector: tfl.Uint16Vector,
    tfl.SparseIndexVector.Uint8Vector: tfl.Uint8Vector,
}


class SparseFormatError(ValueError):
    """The sparsity parameters do not describe the tensor (the reader reports it)."""


@dataclass
class Level:
    """One traversed dimension: dense with `size`, or CSR with segments and indices."""

    size: int
    segments: np.ndarray | None = None
    indices: np.ndarray | None = None


@dataclass
class Sparsity:
    traversal_order: list[int]
    block_map: list[int]
    levels: list[Level]


def _vector(kind: int, table: Any) -> np.ndarray:
    cls = _VECTORS.get(kind)
    if cls is None or table is None:
        raise SparseFormatError(f"sparse index vector of type {kind} is missing or unknown")
    vector = cls()
    vector.Init(table.Bytes, table.Pos)
    return np.asarray(vector.ValuesAsNumpy() if vector.ValuesLength() else [], np.int64)


def read_sparsity(params: Any) -> Sparsity:
    """The sparsity parameters of a TFLite tensor, as plain arrays."""
    order = (
        [int(v) for v in params.TraversalOrderAsNumpy()] if params.TraversalOrderLength() else []
    )
    block_map = [int(v) for v in params.BlockMapAsNumpy()] if params.BlockMapLength() else []
    levels = []
    for k in range(params.DimMetadataLength()):
        meta = params.DimMetadata(k)
        if meta.Format() == tfl.DimensionType.DENSE:
            levels.append(Level(int(meta.DenseSize())))
        else:
            levels.append(
                Level(
                    0,
                    _vector(meta.ArraySegmentsType(), meta.ArraySegments()),
                    _vector(meta.ArrayIndicesType(), meta.ArrayIndices()),
                )
            )
    return Sparsity(order, block_map, levels)


def densify(values: np.ndarray, shape: tuple[int, ...], sparsity: Sparsity) -> np.ndarray:
    """The dense array of `shape` that the stored `values` and `sparsity` describe."""
    n, order, levels = len(shape), sparsity.traversal_order, sparsity.levels
    blocks = sparsity.block_map
    if len(levels) != len(order) or sorted(order) != list(range(n + len(blocks))):
        raise SparseFormatError(
            f"traversal order {order} does not match {len(levels)} "
            f"levels of a rank-{n} tensor with {len(blocks)} block dims"
        )
    block_size = {d: 1 for d in range(n)}
    for b, d in enumerate(blocks):
        if not 0 <= d < n:
            raise SparseFormatError(f"block map {blocks} names a dimension outside rank {n}")
        block_size[d] = levels[order.index(n + b)].size
    pointer = np.zeros(1, np.int64)
    coords = np.zeros((1, len(levels)), np.int64)
    for k, level in enumerate(levels):
        d = order[k]
        bound = shape[d] // max(block_size[d], 1) if d < n else block_size[blocks[d - n]]
        if level.segments is None:  # dense
            size = level.size
            if size != bound:
                raise SparseFormatError(f"dense level {k} has size {size}, expected {bound}")
            pointer = (pointer[:, None] * size + np.arange(size)).reshape(-1)
            coords = np.repeat(coords, size, axis=0)
            coords[:, k] = np.tile(np.arange(size), len(coords) // max(size, 1))
            continue
        segments = level.segments
        indices = level.indices if level.indices is not None else np.zeros(0, np.int64)
        if pointer.size and (pointer.max() + 1 >= segments.size):
            raise SparseFormatError(
                f"level {k} has {segments.size} segments, fewer than its parent's entries need"
            )
        starts, ends = segments[pointer], segments[pointer + 1]
        counts = ends - starts
        if np.any(counts < 0) or (ends.size and ends.max() > indices.size):
            raise SparseFormatError(
                f"level {k}: segments {segments.tolist()[:8]}... are "
                f"not increasing within {indices.size} indices"
            )
        total = int(counts.sum())
        # The concatenated ranges start..end of every parent entry.
        offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        pointer = offsets + np.arange(total)
        coords = np.repeat(coords, counts, axis=0)
        coords[:, k] = indices[pointer]
        if np.any(coords[:, k] < 0) or np.any(coords[:, k] >= bound):
            raise SparseFormatError(f"level {k} has indices outside 0..{bound - 1}")
    if pointer.size and pointer.max() >= values.size:
        raise SparseFormatError(
            f"{values.size} stored values, the index needs {int(pointer.max()) + 1}"
        )
    position = np.zeros((len(pointer), n), np.int64)
    for k, d in enumerate(order):
        if d < n:
            position[:, d] += coords[:, k] * block_size[d]
        else:
            position[:, blocks[d - n]] += coords[:, k]
    dense = np.zeros(shape, values.dtype)
    dense[tuple(position.T)] = values[pointer]
    return dense
