"""Sparse storage of constant tensors: the BITMASK layout of the .spore file.

A pruned weight is mostly zeros; storing it as its nonzero values plus one bit per element
makes an 80%-sparse float32 tensor 0.2 + 1/32 of its dense size (int8 values work the same
way). In the file, a BITMASK tensor's own buffer holds the nonzero values (the tensor's
dtype, row-major order), `sparsity.indices_buffer` the packed mask (numpy.packbits, big
bit order, over the dense tensor in row-major order, unused trailing bits zero) and
`sparsity.dense_shape` the dense shape, equal to the tensor's shape. The reader expands
the tensor to a dense array at load, so kernels never see the sparse form; in memory a
tensor with `sparsity` set is dense and the field only says how the writer stores it.

Everything read from a file is checked before anything is allocated from it: a hostile
file gets ModelFormatError naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sporenet.lite.errors import ModelFormatError
from sporenet.lite.graph import Sparsity, Tensor
from sporenet.proto import model_generated as fb

BITMASK = int(fb.SparseFormat.BITMASK)
FORMAT_NAMES = {int(v): k for k, v in vars(fb.SparseFormat).items() if not k.startswith("_")}

MIN_SAVING = 0.1
"""`sparsify` stores a tensor sparse only when that saves at least this fraction of it."""


def bitmask(shape: tuple[int, ...]) -> Sparsity:
    """The in-memory marker asking the writer to store a tensor of `shape` as a bitmask."""
    return Sparsity(format=BITMASK, dense_shape=tuple(int(d) for d in shape))


def _nonzero(data: np.ndarray) -> np.ndarray:
    """Flat mask of the elements whose bits are not all zero: -0.0 is a value, kept bit
    exact like NaN payloads (writers that want it dropped turn it into +0.0 first)."""
    flat = np.ascontiguousarray(data).reshape(-1)
    return flat.view(f"u{flat.dtype.itemsize}") != 0


def sparse_nbytes(data: np.ndarray) -> int:
    """Bytes of `data` in the BITMASK layout (values plus mask, alignment not counted)."""
    return int(np.count_nonzero(_nonzero(data))) * data.dtype.itemsize + (data.size + 7) // 8


def worth_storing_sparse(data: np.ndarray) -> bool:
    """Whether the BITMASK layout saves at least MIN_SAVING of `data`'s bytes."""
    return data.size > 0 and sparse_nbytes(data) <= (1.0 - MIN_SAVING) * data.nbytes


def encode(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, packed mask) of a dense array in the BITMASK layout."""
    nonzero = _nonzero(data)
    return np.ascontiguousarray(data).reshape(-1)[nonzero], np.packbits(nonzero)


def check(tensor: Tensor, index: int) -> None:
    """Validate the sparsity marker of an in-memory tensor (ModelFormatError if wrong)."""
    s = tensor.sparsity
    if s is None:
        return
    what = f"tensor {index} ({tensor.name!r})"
    if s.format != BITMASK:
        name = FORMAT_NAMES.get(int(s.format), str(s.format))
        raise ModelFormatError(f"{what}: sparse format {name} is not supported; expected BITMASK")
    if tensor.data is None:
        raise ModelFormatError(f"{what}: only constant tensors can be stored sparse")
    if tuple(s.dense_shape) != tuple(tensor.shape):
        raise ModelFormatError(
            f"{what}: sparsity dense_shape {list(s.dense_shape)} differs from the tensor's "
            f"shape {list(tensor.shape)}"
        )


def read(
    sparsity: Any,
    *,
    what: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    values: tuple[int, int],
    buffers: list[tuple[int, int]],
    buf: Any,
    spend: Callable[[int, str], None],
    ints: Callable[..., list[int]],
) -> np.ndarray:
    """Expand the BITMASK tensor whose schema table is `sparsity` to a read-only dense array.

    `values` is the (offset, size) of the tensor's own buffer, `buffers` the model's buffer
    table, `spend` and `ints` the reader's work budget and checked vector accessor.
    """
    fmt = sparsity.Format()
    if fmt != BITMASK:
        name = FORMAT_NAMES.get(int(fmt), str(fmt))
        raise ModelFormatError(f"{what}: sparse format {name} is not supported; expected BITMASK")
    dense_shape = tuple(ints(sparsity, 4, "DenseShape", 8, what + " dense_shape"))
    if dense_shape != shape:
        raise ModelFormatError(
            f"{what}: sparsity dense_shape {list(dense_shape)} differs from the tensor's shape "
            f"{list(shape)}"
        )
    if ints(sparsity, 1, "BlockShape", 4, what + " block_shape"):
        raise ModelFormatError(f"{what}: a BITMASK tensor has no block_shape")
    if sparsity.IndptrBuffer() != 0:
        raise ModelFormatError(
            f"{what}: a BITMASK tensor has no indptr buffer, got buffer {sparsity.IndptrBuffer()}"
        )
    mask_index = sparsity.IndicesBuffer()
    if not 0 < mask_index < len(buffers):
        raise ModelFormatError(
            f"{what}: mask buffer index {mask_index} out of range (1..{len(buffers) - 1})"
        )
    count = math.prod(shape)  # Python ints: a hostile shape cannot overflow
    mask_offset, mask_size = buffers[mask_index]
    expected_mask = (count + 7) // 8
    if mask_size != expected_mask:
        raise ModelFormatError(
            f"{what}: mask buffer {mask_index} holds {mask_size} bytes but shape {list(shape)} "
            f"needs {expected_mask}"
        )
    # The dense array is allocated from a mask the file holds: charge it like the mask's
    # bytes, so tensors sharing one mask cannot multiply the memory a small file takes.
    spend(mask_size // 4 + 1, what)
    values_offset, values_size = values
    if values_size % dtype.itemsize:
        raise ModelFormatError(
            f"{what}: values buffer of {values_size} bytes is not a whole number of "
            f"{dtype} elements"
        )
    nnz = values_size // dtype.itemsize
    mask = np.frombuffer(buf, np.uint8, mask_size, mask_offset)
    bits = np.unpackbits(mask)
    if bits[count:].any():
        raise ModelFormatError(f"{what}: unused trailing bits of the mask are not zero")
    ones = int(np.count_nonzero(bits))
    if ones != nnz:
        raise ModelFormatError(
            f"{what}: mask marks {ones} nonzero elements but the values buffer holds {nnz}"
        )
    vals = np.frombuffer(
        bytes(memoryview(buf)[values_offset : values_offset + values_size]), dtype=dtype, count=nnz
    )
    dense = np.zeros(count, dtype=dtype)
    dense[bits[:count].view(bool)] = vals
    dense = dense.reshape(shape)
    dense.flags.writeable = False
    return dense
