"""NumPy functions called without the array-function protocol's dispatch.

`np.copyto`, `np.dot`, `np.concatenate` and `np.putmask` first run a Python dispatcher
that looks for `__array_function__` overrides among their arguments (NEP 18): on every
call a cost as large as a small layer's copy itself. A plan's steps pass only the plain
ndarrays the planner made, which override nothing, so they call the C implementations
directly (the functions themselves where NumPy has no separate implementation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def _implementation(function: Callable[..., Any]) -> Callable[..., Any]:
    return getattr(function, "_implementation", function)


copyto: Callable[..., None] = _implementation(np.copyto)
dot: Callable[..., Any] = _implementation(np.dot)
concatenate: Callable[..., Any] = _implementation(np.concatenate)
putmask: Callable[..., None] = _implementation(np.putmask)
