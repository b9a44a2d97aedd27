"""Giving back the resident pages of a memory-mapped model file that the plan no longer
reads.

A weight that a kernel replaces with a form of its own (dequantized from int8, widened
from float16) is read once from the mapped file, and its pages then stay resident beside
the replacement. Dropping them keeps only the replacement in memory; the file's bytes are
unchanged, and a later read of the original faults them back in from the file.

Kernels that pack their weights (transposed, with the bias as an extra column) drop the
originals the same way, through `release_unless_read` when only some layouts pack.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


def _mapping(array: np.ndarray) -> mmap.mmap | None:
    """The read-only (file) mapping `array` is a view of, if any: a writable mapping (the
    plan's arena) holds data that dropped pages would lose."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    if not isinstance(base, mmap.mmap) or not memoryview(base).readonly:
        return None
    return base


def is_mapped(array: np.ndarray) -> bool:
    """Whether `array` views a read-only file mapping (pages `release` can drop): a
    planner keeps only these to release again, not weights it computed itself."""
    return _mapping(array) is not None


_noted: list[np.ndarray] | None = None


@contextmanager
def noting_unread() -> Iterator[list[np.ndarray]]:
    """While active, the arrays kernels give up (`release`, and `release_unless_read`
    when no operand views them) are also noted in the yielded list: the planner then drops
    its own references to weights it computed when every step reading them packed them."""
    global _noted
    previous, _noted = _noted, []
    try:
        yield _noted
    finally:
        _noted = previous


def release(array: np.ndarray) -> bool:
    """Drop the resident pages that lie wholly inside `array`, when it is a view of a
    read-only file mapping and the platform can; returns whether pages were dropped.
    The caller's step does not read `array` again (see noting_unread)."""
    if _noted is not None:
        _noted.append(array)
    mapped = _mapping(array)
    advise = getattr(mapped, "madvise", None)
    if mapped is None or advise is None or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    start = array.ctypes.data - np.frombuffer(mapped, np.uint8).ctypes.data
    lo = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    hi = (start + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi <= lo:
        return False
    advise(mmap.MADV_DONTNEED, lo, hi - lo)
    return True


def release_unless_read(original: np.ndarray, *operands: np.ndarray) -> None:
    """`release(original)` unless one of `operands` (the arrays a step reads) may be a
    view of it: for a kernel that packs its weights only in some layouts."""
    if not any(np.may_share_memory(original, a) for a in operands):
        release(original)
