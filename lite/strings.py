"""The byte layout of a constant STRING tensor in a .spore buffer.

One little-endian uint32 byte length per element (row-major order), then the UTF-8 bytes
of every element, back to back. The reader checks the lengths against the buffer before
it decodes anything, so a hostile buffer is a ModelFormatError, never a huge allocation.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.dtypes import STRING, as_strings
from sporenet.lite.errors import ModelFormatError

_LENGTH = np.dtype("<u4")


def encode(array: np.ndarray) -> np.ndarray:
    """The buffer bytes (uint8) of a string tensor."""
    texts = [s.encode() for s in as_strings(array).flat]
    lengths = np.asarray([len(t) for t in texts], _LENGTH)
    return np.frombuffer(lengths.tobytes() + b"".join(texts), np.uint8)


def decode(raw: bytes | memoryview, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The read-only object array of str stored in `raw` (encode's layout)."""
    count = int(np.prod(shape, dtype=np.int64))
    head = count * _LENGTH.itemsize
    if len(raw) < head:
        raise ModelFormatError(
            f"{what}: a string tensor of {count} elements needs at least {head} bytes of "
            f"lengths, the buffer holds {len(raw)}"
        )
    lengths = np.frombuffer(raw, _LENGTH, count=count).astype(np.int64)
    total = int(lengths.sum())
    if head + total != len(raw):
        raise ModelFormatError(
            f"{what}: string lengths sum to {total} bytes but the buffer holds "
            f"{len(raw) - head} after them"
        )
    ends = head + np.cumsum(lengths)
    data = bytes(raw)
    out = np.empty(count, STRING)
    start = head
    try:
        for k, end in enumerate(ends.tolist()):
            out[k] = data[start:end].decode()
            start = end
    except UnicodeDecodeError as exc:
        raise ModelFormatError(f"{what}: element {k} is not valid UTF-8 ({exc.reason})") from None
    out = out.reshape(shape)
    out.flags.writeable = False
    return out
