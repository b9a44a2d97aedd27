"""FlatBuffer tables read by direct offset arithmetic, with bounds and a work budget.

The generated accessors (proto/model_generated.py) look a field up through several
Python calls each; a model of a few hundred nodes and tensors then spends most of its
load in them. This reader decodes a table's whole vtable with one `struct` call and reads
each field at its absolute position, so a table costs a handful of C calls.

Every position comes from forward (unsigned) offsets except a table's vtable, which is
checked to lie inside the file; vector lengths are checked against the bytes that could
hold them before anything is iterated. A read past the end raises `struct.error`, which
the caller turns into a ModelFormatError.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from sporenet.lite.errors import ModelFormatError

_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}  # element size -> struct code (signed)
_FLOAT_CODES = {4: "f", 8: "d"}
_MAX_FIELDS = 16
# The vtable entries of a table with n fields, for every n a table of the schema has.
_VTABLE = [struct.Struct(f"<{n}H").unpack_from for n in range(_MAX_FIELDS + 1)]
# An honest file has a few distinct vtables (one per table type and set of fields held); a
# hostile one with a vtable per table does not grow the cache past this.
_MAX_CACHED_VTABLES = 1024


class FlatReader:
    """Reads tables, vectors and strings of one FlatBuffer held in `buf`.

    `budget` bounds the elements (and 4-byte units of string) read in total, so offsets
    shared by many tables cannot multiply the work or the memory. A vector of n elements
    or a string of 4n bytes occupies at least 4(n + 1) bytes of the file, so an honest
    file spends at most size/4; twice that leaves room for writers that share strings.
    """

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.size = len(buf)
        self.budget = self.size // 2 + 1024
        self._vtables: dict[tuple[int, int], tuple[int, ...]] = {}
        self._arrays: dict[tuple[str, bytes], np.ndarray] = {}

    def spend(self, units: int, what: str) -> None:
        self.budget -= units
        if self.budget < 0:
            raise ModelFormatError(f"{what}: file references far more data than it holds")

    def table(self, pos: int, fields: int, what: str) -> list[int]:
        """Absolute positions of the first `fields` fields of the table at `pos` (0 for
        a field the table does not hold)."""
        vtable = pos - _I32(self.buf, pos)[0]
        entries = self._vtables.get((vtable, fields))
        if entries is None:
            entries = self._vtable(vtable, fields, pos, what)
            if len(self._vtables) < _MAX_CACHED_VTABLES:
                self._vtables[vtable, fields] = entries
        return [pos + e if e else 0 for e in entries]

    def _vtable(self, vtable: int, fields: int, pos: int, what: str) -> tuple[int, ...]:
        """The first `fields` entries of the vtable at `vtable` (0 past its end), checked
        to lie inside the file. Writers share one vtable among the tables of one shape."""
        if vtable < 0 or vtable + 4 > self.size:
            raise ModelFormatError(
                f"{what}: table at offset {pos} has its vtable at {vtable}, outside the "
                f"{self.size}-byte file"
            )
        held = min(max(_U16(self.buf, vtable)[0] - 4, 0) // 2, fields)
        return _VTABLE[held](self.buf, vtable + 4) + (0,) * (fields - held)

    # ---- scalars at an absolute field position (0: absent, the default)
    def u32(self, at: int, default: int = 0) -> int:
        return _U32(self.buf, at)[0] if at else default

    def scalar(self, at: int, code: str, default: int | float = 0) -> Any:
        return struct.unpack_from(code, self.buf, at)[0] if at else default

    # ---- offsets to tables, vectors and strings
    def target(self, at: int) -> int:
        """Where the offset stored at `at` points (forward only)."""
        return at + _U32(self.buf, at)[0]

    def vector(self, at: int, elem_size: int, what: str) -> tuple[int, int]:
        """(length, start of the elements) of the vector field at `at`, checked."""
        if not at:
            return 0, 0
        vec = at + _U32(self.buf, at)[0]
        length = _U32(self.buf, vec)[0]
        start = vec + 4
        if start + length * elem_size > self.size:
            raise ModelFormatError(
                f"{what}: vector of {length} elements at offset {start} runs past the end "
                f"of the {self.size}-byte file"
            )
        self.budget -= length + 1
        if self.budget < 0:
            raise ModelFormatError(f"{what}: file references far more data than it holds")
        return length, start

    def ints(self, at: int, elem_size: int, what: str) -> list[int]:
        n, start = self.vector(at, elem_size, what)
        if n == 0:
            return []
        return list(struct.unpack_from(f"<{n}{_INT_CODES[elem_size]}", self.buf, start))

    def floats(self, at: int, elem_size: int, what: str) -> list[float]:
        n, start = self.vector(at, elem_size, what)
        if n == 0:
            return []
        return list(struct.unpack_from(f"<{n}{_FLOAT_CODES[elem_size]}", self.buf, start))

    def array(self, at: int, dtype: np.dtype, what: str) -> np.ndarray:
        """The vector field at `at` as a read-only 1-D array of the little-endian `dtype`
        (in native byte order): a view of the file's bytes, one for all vectors of equal
        bytes, so a model's many small quantization vectors cost an array header each at
        most."""
        n, start = self.vector(at, dtype.itemsize, what)
        key = (dtype.char, bytes(memoryview(self.buf)[start : start + n * dtype.itemsize]))
        found = self._arrays.get(key)
        if found is None:
            # (np.ndarray on the buffer: frombuffer would add a memoryview per array)
            found = np.ndarray((n,), dtype, self.buf, start if n else 0)
            if not dtype.isnative:
                found = found.astype(dtype.newbyteorder("="))
            found.flags.writeable = False
            self._arrays[key] = found
        return found

    def tables(self, at: int, what: str) -> list[int]:
        """Positions of the tables (or strings) a vector of offsets points to."""
        n, start = self.vector(at, 4, what)
        if n == 0:
            return []
        offsets = struct.unpack_from(f"<{n}I", self.buf, start)
        return [start + 4 * k + o for k, o in enumerate(offsets)]

    def string(self, at: int, what: str) -> str:
        """The string field at `at` ("" when absent)."""
        return self.string_at(at + _U32(self.buf, at)[0], what) if at else ""

    def string_at(self, pos: int, what: str) -> str:
        """The string whose length prefix lies at `pos`."""
        length = _U32(self.buf, pos)[0]
        if pos + 4 + length > self.size:
            raise ModelFormatError(f"{what}: string longer than the file")
        self.budget -= length // 4 + 1
        if self.budget < 0:
            raise ModelFormatError(f"{what}: file references far more data than it holds")
        try:
            return str(self.buf[pos + 4 : pos + 4 + length], "utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"{what}: string is not valid UTF-8 ({exc})") from None
