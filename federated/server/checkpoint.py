"""Aggregate checkpoints: named arrays in one file, written without zip or CRC passes.

`numpy.savez` builds a zip archive and computes a CRC32 over every byte, which costs more
than writing the running sums themselves. A checkpoint here is a small JSON header (name,
dtype, shape, offset of each array) followed by the raw arrays, written to a temporary
file and renamed into place, so a `kill -9` leaves either the old or the new checkpoint.
Object arrays are refused (nothing is ever unpickled).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sporenet.federated.errors import AggregationError

MAGIC = b"SPORECKPT1\n"
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
    start = -(-(len(MAGIC) + 8 + len(header)) // _ALIGN) * _ALIGN
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header)
        for at, a in blobs:
            f.seek(start + at)
            if a.nbytes:
                f.write(memoryview(a.reshape(-1)).cast("B") if a.ndim else a.tobytes())
        f.truncate(start + offset)
    os.replace(tmp, path)


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays saved by `save_arrays` (copies, not views of the file)."""
    data = path.read_bytes()
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a sporenet checkpoint")
        (size,) = struct.unpack_from("<Q", data, len(MAGIC))
        head_end = len(MAGIC) + 8 + size
        entries = json.loads(data[len(MAGIC) + 8 : head_end])
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
