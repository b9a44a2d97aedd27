"""Large arrays placed on 2 MiB boundaries, where the kernel can back them with
transparent huge pages.

NumPy asks Linux for huge pages on its large allocations (madvise), but malloc returns
them a few bytes past a page boundary, so only the 2 MiB regions that lie wholly inside
get huge pages. A kernel that streams a packed weight of several MiB on every step (an
LSTM's recurrent matrix, read once per time step) then takes a TLB miss every 4 KiB of
its partly small-paged remainder. Starting the array on a 2 MiB boundary lets every
whole 2 MiB of it be a huge page: on ddddocr's captcha recognizer (an 8 MiB R) the LSTM
step ran 8% faster. Where the kernel gives no huge pages the array is an ordinary one,
over-allocated by at most 2 MiB of address space that is never touched.
"""

from __future__ import annotations

import math

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
    raw = np.empty(nbytes + HUGE_PAGE, np.uint8)
    offset = -raw.ctypes.data % HUGE_PAGE
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)
