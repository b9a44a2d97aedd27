"""Aggregate checkpoints: named arrays in one file, written without zip or CRC passes.

`numpy.savez` builds a zip archive and computes a CRC32 over every byte, which costs more
than writing the running sums themselves. A checkpoint here is a small JSON header (name,
dtype, shape, offset of each array) followed by the raw arrays, written to a temporary
file and renamed into place, so a `kill -9` leaves either the old or the new checkpoint.
The header carries the CRC-32 of the bytes after it (one zlib pass as they are written), so
a damaged checkpoint is refused on load instead of silently shifting the next model.
Object arrays are refused (nothing is ever unpickled).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sporenet.federated.errors import AggregationError

MAGIC = b"SPORECKPT2\n"
_ALIGN = 64


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write `arrays` to `path` atomically (temporary file, then rename)."""
    entries, blobs, offset = [], [], 0
    for name, value in arrays.items():
        a = np.ascontiguousarray(value) if np.ndim(value) else np.asarray(value)
        if a.dtype.hasobject:
            raise AggregationError(f"checkpoint array {name!r} has dtype object")
        offset = -(-offset // _ALIGN) * _ALIGN
        entries.append(
            {"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset}
        )
        blobs.append((offset, a))
        offset += a.nbytes
    header = json.dumps(entries).encode()
    start = -(-(len(MAGIC) + 12 + len(header)) // _ALIGN) * _ALIGN
    tmp = path.with_name(path.name + ".tmp")
    head = header + bytes(start - len(MAGIC) - 12 - len(header))
    crc, written = zlib.crc32(head), 0
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<QI", len(header), 0) + head)
        for at, a in blobs:
            pad = bytes(at - written)
            data = memoryview(a.reshape(-1)).cast("B") if a.ndim else a.tobytes()
            for piece in (pad, data):
                crc = zlib.crc32(piece, crc)
                f.write(piece)
            written = at + a.nbytes
        f.seek(len(MAGIC) + 8)
        f.write(struct.pack("<I", crc & 0xFFFFFFFF))
    os.replace(tmp, path)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays saved by `save_arrays` (copies, not views of the file).

    Raises:
        AggregationError: the file cannot be read, is not a checkpoint, or its bytes do
            not match the CRC-32 in its header.
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise AggregationError(
            f"aggregate checkpoint {str(path)!r} is unreadable: {err.strerror or err}"
        ) from None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a sporenet checkpoint")
        size, crc = struct.unpack_from("<QI", data, len(MAGIC))
        head_end = len(MAGIC) + 12 + size
        found = zlib.crc32(memoryview(data)[len(MAGIC) + 12 :]) & 0xFFFFFFFF
        if found != crc:
            raise ValueError(f"its bytes have CRC-32 {found:08x}, its header says {crc:08x}")
        entries = json.loads(data[len(MAGIC) + 12 : head_end])
        start = -(-head_end // _ALIGN) * _ALIGN
        out: dict[str, np.ndarray] = {}
        for e in entries:
            dtype = np.dtype(e["dtype"])
            if dtype.hasobject:
                raise ValueError(f"array {e['name']!r} has dtype object")
            shape = tuple(int(d) for d in e["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            at = start + int(e["offset"])
            if at + count * dtype.itemsize > len(data):
                raise ValueError(f"array {e['name']!r} runs past the end of the file")
            out[str(e["name"])] = (
                np.frombuffer(data, dtype, count=count, offset=at).reshape(shape).copy()
            )
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise AggregationError(f"aggregate checkpoint {str(path)!r} is unreadable: {e}") from None
    return out
