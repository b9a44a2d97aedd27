"""Bounding the BLAS thread pool NumPy uses, without extra dependencies.

Finds the OpenBLAS that NumPy wheels bundle and calls its set/get functions through ctypes
(threadpoolctl does the same, but lite depends on numpy and flatbuffers only). Where no
OpenBLAS is found the limit is a no-op.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
_GETTERS = (
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "openblas_get_num_threads",
)


def _find_openblas() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    root = os.path.dirname(os.path.dirname(np.__file__))
    candidates = glob.glob(os.path.join(root, "numpy.libs", "*openblas*"))
    candidates += glob.glob(os.path.join(os.path.dirname(np.__file__), ".dylibs", "*openblas*"))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            setter.argtypes = [ctypes.c_int]
            getter.restype = ctypes.c_int
            return setter, getter
    return None


THREADS_ENV = "SPORENET_THREADS"
"""Environment variable naming the BLAS threads a run uses when its code names none."""
DEFAULT_THREADS = 1
"""BLAS threads when neither the caller nor $SPORENET_THREADS names a count.

One: the models a device runs are small, so their products gain little from more
threads, while OpenBLAS threads that wait for each other spin and collapse when other
work shares the cores (`benchmarks/threads.py` measures both).
"""


def default_threads() -> int | None:
    """$SPORENET_THREADS (0: the BLAS library's own choice, None), else DEFAULT_THREADS."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return DEFAULT_THREADS
    if not value.isdigit():
        raise ValueError(f"${THREADS_ENV} must be a thread count >= 0, got {value!r}")
    return int(value) or None


class BlasThreads:
    """Set and restore the BLAS thread count around a call: `with limiter.limit(n): ...`."""

    def __init__(self) -> None:
        self._api = _find_openblas()

    @property
    def available(self) -> bool:
        return self._api is not None

    def get(self) -> int | None:
        return self._api[1]() if self._api else None

    def set(self, n: int) -> None:
        if self._api:
            self._api[0](int(n))

    def call(self, n: int | None, step: Callable[[], None]) -> None:
        """Run `step` with BLAS at `n` threads (None: as it is), restoring the count after.

        `limit` as a plain call for a plan's run: a tiny model's invoke lasts a few
        microseconds, of which a context manager's generator would be a large share, and
        when the pool already has `n` threads nothing is set at all."""
        api = self._api
        if api is None or n is None:
            step()
            return
        previous = api[1]()
        if previous == n:
            step()
            return
        api[0](n)
        try:
            step()
        finally:
            api[0](previous)

    @contextmanager
    def limit(self, n: int | None) -> Iterator[None]:
        """Within the block BLAS runs `n` threads (None: `default_threads()`); the previous
        count comes back after it. Where no BLAS's threads can be set, nothing changes."""
        if n is None:
            n = default_threads()
        if n is None or self._api is None:
            yield
            return
        previous = self._api[1]()
        self.set(n)
        try:
            yield
        finally:
            self.set(previous)


BLAS = BlasThreads()
"""The process-wide BLAS thread controller."""
