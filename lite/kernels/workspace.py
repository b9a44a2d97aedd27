"""Temporaries of kernel steps, planned by lifetime with the graph's tensors.

A step's temporaries (im2col columns, Winograd tiles, accumulators) hold nothing between
calls: they are written before they are read and dead when the step returns. So they
need not be private to the kernel. While the planner binds a node, `temporary()` takes
them from the plan's arena, as it takes the node's outputs, and the planner returns them
to the arena right after the node, so later tensors and later nodes' temporaries reuse the
same bytes: the plan's peak memory is then its widest cut, temporaries included, not the
sum of every layer's scratch.

A buffer that must keep content between calls (a zero border written once, a row of ones
that carries a bias through a GEMM and is not rewritten) cannot be a temporary; a kernel
either allocates it itself or rewrites that content in its step.

Outside planning (a kernel bound directly, constant folding), `temporary()` is `np.empty`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np


class Late:
    """A temporary of a step's last pass (a fused activation's scratch), which may share
    bytes with the step's other temporaries: `array` is set once they are given back
    (Workspace.place_late), before the step first runs."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray | None = None) -> None:
        self.array = array


class Workspace:
    """Hands out one node's temporaries from `take(nbytes) -> uint8 block` and remembers
    the blocks, which `release()` gives back when the node is bound.

    With `late`, a `temporary_after` request is placed only by `place_late()`, after the
    node's other temporaries are given back (the planner's workspace); without, at once."""

    def __init__(self, take: Callable[[int], np.ndarray], *, late: bool = False) -> None:
        self._take = take
        self._taken: list[np.ndarray] = []
        self._late: list[tuple[Late, tuple[int, ...], np.dtype]] | None = [] if late else None

    def temporary(self, shape: Sequence[int], dtype: np.dtype | type) -> np.ndarray:
        dtype = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        block = self._take(nbytes)
        self._taken.append(block)
        return block[:nbytes].view(dtype).reshape(shape)

    def temporary_after(self, shape: Sequence[int], dtype: np.dtype | type) -> Late:
        """A temporary read and written only after the step's other temporaries are dead."""
        if self._late is None:
            return Late(self.temporary(shape, dtype))
        late = Late()
        self._late.append((late, tuple(int(d) for d in shape), np.dtype(dtype)))
        return late

    def release(self) -> list[np.ndarray]:
        """The blocks taken since the last release (the caller returns them to its pool)."""
        taken, self._taken = self._taken, []
        return taken

    def place_late(self) -> list[np.ndarray]:
        """Place the pending `temporary_after` requests (call it once the node's other
        temporaries are given back); returns their blocks, to give back in turn."""
        for late, shape, dtype in self._late or ():
            late.array = self.temporary(shape, dtype)
        if self._late:
            self._late.clear()
        return self.release()


class _Active(threading.local):
    """The workspaces being bound, per thread: plans built at the same time in several
    threads (clients training side by side) must not take each other's temporaries."""

    def __init__(self) -> None:
        self.stack: list[Workspace] = []


_active = _Active()


@contextmanager
def active(workspace: Workspace) -> Iterator[Workspace]:
    """Make `temporary()` draw from `workspace` inside the block, in this thread (nests: a
    control-flow kernel planning its subgraph while it is bound gets the subgraph's own
    workspace)."""
    _active.stack.append(workspace)
    try:
        yield workspace
    finally:
        _active.stack.pop()


def temporary(shape: Sequence[int], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised array a step may use only while it runs (see the module docstring)."""
    stack = _active.stack
    if not stack:
        return np.empty(shape, dtype)
    return stack[-1].temporary(shape, dtype)


def temporary_after(shape: Sequence[int], dtype: np.dtype | type) -> Late:
    """A temporary for a step's last pass, which may share bytes with the step's other
    temporaries (see Late); outside planning, a fresh array at once."""
    stack = _active.stack
    if not stack:
        return Late(np.empty(shape, dtype))
    return stack[-1].temporary_after(shape, dtype)


def temporary_like(array: np.ndarray) -> np.ndarray:
    """A temporary of `array`'s shape, dtype and memory order, as `np.empty_like` gives
    (an NCHW view of channels-last memory gets one laid out so too: ufuncs over both then
    walk the same order)."""
    order = sorted(range(array.ndim), key=lambda axis: -abs(array.strides[axis]))
    buf = temporary([array.shape[axis] for axis in order], array.dtype)
    return buf.transpose(np.argsort(order))


def padded_temporary(
    shape: Sequence[int],
    dtype: np.dtype | type,
    axes: tuple[int, int],
    rows: tuple[int, int],
    cols: tuple[int, int],
    fill: float = 0.0,
) -> tuple[np.ndarray, Callable[[], None]]:
    """A temporary padded image and the step that rewrites its border.

    `axes` are the buffer's (row, column) axes and `rows`, `cols` the [start, stop) of the
    interior that each call overwrites; the step `refill()` sets everything outside it to
    `fill`. A padded copy kept by its kernel would need its border written only once, but
    costs a whole input's memory per layer; the border is a thin frame, cheap to rewrite.
    """
    buf = temporary(shape, dtype)
    ay, ax = axes
    r0, r1 = rows
    c0, c1 = cols

    def part(r: slice, c: slice) -> np.ndarray:
        index = [slice(None)] * buf.ndim
        index[ay], index[ax] = r, c
        return buf[tuple(index)]

    frame = [
        part(slice(0, r0), slice(None)),
        part(slice(r1, None), slice(None)),
        part(slice(r0, r1), slice(0, c0)),
        part(slice(r0, r1), slice(c1, None)),
    ]
    frame = [f for f in frame if f.size]

    def refill() -> None:
        for f in frame:
            f.fill(fill)

    return buf, refill
