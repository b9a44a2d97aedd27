"""Giving the C heap's free pages back to the system between conversion stages.

glibc's malloc keeps the pages of freed small blocks mapped (the parsed ONNX message, the
import's temporaries), while a large new buffer, such as the serialized model, gets a
mapping of its own and never reuses them: both would count in the process's peak. Trimming
the heap before the output is written returns those pages. Where malloc_trim does not
exist (another C library), this is a no-op.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def trim_heap() -> None:
    """Return the C heap's free pages to the system, where the C library can."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
