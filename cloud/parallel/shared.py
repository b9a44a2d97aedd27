"""Named NumPy arrays packed into one shared-memory block that processes attach by name."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

ALIGN = 64  # cache-line aligned arrays, as the .spore weight segment


@dataclass(frozen=True)
class Layout:
    """Where each array lives in a block: picklable, so workers attach by it."""

    block: str
    arrays: tuple[tuple[str, tuple[int, ...], str, int], ...]  # name, shape, dtype, offset
    size: int


class SharedArrays:
    """A shared-memory block viewed as named arrays; the creator unlinks it."""

    def __init__(self, layout: Layout, memory: shared_memory.SharedMemory, owner: bool) -> None:
        self.layout = layout
        self._memory = memory
        self._owner = owner
        self.arrays = {
            name: np.ndarray(shape, np.dtype(dtype), buffer=memory.buf, offset=offset)
            for name, shape, dtype, offset in layout.arrays
        }

    @classmethod
    def create(cls, specs: Sequence[tuple[str, tuple[int, ...], np.dtype]]) -> SharedArrays:
        entries, offset = [], 0
        for name, shape, dtype in specs:
            entries.append((name, tuple(shape), np.dtype(dtype).str, offset))
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            offset += -(-max(nbytes, 1) // ALIGN) * ALIGN
        memory = shared_memory.SharedMemory(create=True, size=max(offset, ALIGN))
        layout = Layout(block=memory.name, arrays=tuple(entries), size=offset)
        return cls(layout, memory, owner=True)

    @classmethod
    def attach(cls, layout: Layout) -> SharedArrays:
        return cls(layout, shared_memory.SharedMemory(name=layout.block), owner=False)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def close(self) -> None:
        """Drop the views and the mapping (and the block itself, for its creator)."""
        self.arrays.clear()  # in place: holders of the dict see the views gone
        # A view still referenced keeps the mapping; it goes with the process.
        with contextlib.suppress(BufferError):
            self._memory.close()
        if self._owner:
            self._memory.unlink()
