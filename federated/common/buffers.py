"""A pool of reusable payload buffers: what server receive slots and clients share."""

from __future__ import annotations

import threading


class BufferPool:
    """Payload-sized buffers, reused from one transfer to the next.

    A fresh model- or update-sized buffer costs a zeroed page fault per 4 KiB (the server
    unmaps every freed one, see server/daemon.py; a client's allocator often does too):
    for a 4 MB update, more than moving it. The server keeps one idle receive buffer per
    upload slot and empties the pool when a phase closes, so it adds nothing to the peak
    memory of aggregation and publishing; a client keeps the buffers of its last model and
    its last update for the next round. A buffer is reused only when nothing views it any
    more (`give` checks), so a caller may give back a buffer whose contents someone kept.
    Nor is one taken before a `clear`: an upload folded while its phase closes must not
    park its buffer in the pool through aggregation.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._idle: list[_Buffer] = []
        self._generation = 0  # clears so far: a buffer taken before the last one is not kept
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        """A writable view of exactly `size` bytes (contents undefined)."""
        with self._lock:
            for i, buf in enumerate(self._idle):
                if size <= len(buf) <= 2 * size:
                    return memoryview(self._idle.pop(i))[:size]
            generation = self._generation
        buf = _Buffer(size)
        buf.generation = generation
        return memoryview(buf)

    def clear(self) -> None:
        """Free the idle buffers (quick: a RoundManager change listener)."""
        with self._lock:
            self._idle.clear()
            self._generation += 1

    def give(self, view: memoryview) -> None:
        """Take back a view from `take`. Its buffer is kept for reuse only if no other view
        of it is alive (a slice, a NumPy array over it); otherwise it is left to them."""
        buf = view.obj
        try:
            view.release()
        except BufferError:
            return
        if isinstance(buf, _Buffer) and _unviewed(buf):
            with self._lock:
                if buf.generation != self._generation:  # taken before a clear
                    return
                self._idle.append(buf)
                if len(self._idle) > self.limit:
                    self._idle.pop(0)


class _Buffer(bytearray):
    """A pooled buffer: a bytearray that remembers the pool's generation it was made in."""

    __slots__ = ("generation",)


def _unviewed(buf: bytearray) -> bool:
    """Whether no view of `buf` is alive: a bytearray refuses to resize while one is.
    (Releasing a memoryview does not tell: its slices and arrays keep the buffer.)"""
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True
