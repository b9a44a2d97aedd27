"""Ufunc calls whose IEEE special results (inf, nan) are the answer, without warnings.

`np.errstate` is a context manager whose entry and exit cost about 2 us: on a tiny
layer (a 1x1 sigmoid, a layer norm's rsqrt) more than the arithmetic. `quietly` sets
NumPy's floating-point error state for one call through the context variable that
errstate itself sets, for a fraction of that. NumPy builds without that private path
get np.errstate (same results).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_umath: Any = getattr(getattr(np, "_core", None), "umath", None)
_contextvar: Any = getattr(_umath, "_extobj_contextvar", None)
_make: Any = getattr(_umath, "_make_extobj", None)
_IGNORE: Any = _make(all="ignore") if callable(_make) and _contextvar is not None else None


def _errstate_call(ufunc: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with np.errstate(all="ignore"):
        return ufunc(*args, **kwargs)


def _contextvar_call(ufunc: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    token = _contextvar.set(_IGNORE)
    try:
        return ufunc(*args, **kwargs)
    finally:
        _contextvar.reset(token)


quietly: Callable[..., Any] = _errstate_call if _IGNORE is None else _contextvar_call
"""quietly(ufunc, *args, **kwargs): the call with every floating-point error ignored,
as inside np.errstate(all="ignore")."""
