"""Update payloads: named float tensors <-> TensorBundle bytes, with optional compression.

Compression applies to deltas (trained minus global weights), where it loses little:
- "int8": symmetric per-tensor quantization, value = q * scale, scale = max|x| / 127;
- "topk": only the `topk_ratio` largest-magnitude entries, as flat uint32 positions and
  float32 values (combine with "int8" to quantize the kept values too).
Decoding is strict: every inconsistency is an `UpdateRejectedError` naming the tensor.
"""

from __future__ import annotations

import functools
import math
import mmap
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from sporenet.federated.aggregation import Template, Weights
from sporenet.federated.errors import ConfigError, UpdateRejectedError
from sporenet.proto import federated_pb2 as pb

COMPRESSIONS = ("int8", "topk")
Buffer = bytearray | memoryview  # a writable buffer encode_raw writes an update into
_INT8_MAX = 127.0


def _quantize_int8(x: np.ndarray) -> tuple[bytes, float]:
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    scale = peak / _INT8_MAX if peak > 0 else 1.0
    q = np.clip(np.rint(x / scale), -_INT8_MAX, _INT8_MAX).astype(np.int8)
    return q.tobytes(), scale


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _raw_head(name: str, dtype: np.dtype, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The bytes of an ENCODING_RAW NamedTensor (in its bundle) that precede its data."""
    fields = _length_delimited(1, name.encode()) + _length_delimited(2, dtype.name.encode())
    if shape:
        fields += _length_delimited(3, b"".join(_varint(int(d)) for d in shape))
    if nbytes:  # proto3 leaves an empty bytes field out
        fields += _varint(5 << 3 | 2) + _varint(nbytes)  # data; its bytes follow
    return _varint(1 << 3 | 2) + _varint(len(fields) + nbytes) + fields


def encode_raw(
    update: Mapping[str, np.ndarray],
    base: Mapping[str, np.ndarray] | None = None,
    *,
    alloc: Callable[[int], Buffer] = bytearray,
) -> Buffer:
    """A TensorBundle of ENCODING_RAW tensors, written by hand into one buffer.

    Each tensor's values are written once, straight into the message (protobuf would copy
    them three times: `tobytes`, the field, the serialization). With `base`, the tensors
    written are `update[k] - base[k]` (a client's delta), computed in place. Byte-for-byte
    what `pb.TensorBundle.SerializeToString` gives for the same tensors. `alloc(size)`
    gives the buffer (a client reuses its last update's: see buffers.BufferPool).
    """
    heads: list[tuple[bytes, np.ndarray, np.ndarray | None]] = []
    size = 0
    for name, value in update.items():
        a = np.asarray(value)
        dtype = np.dtype(base[name].dtype) if base is not None else a.dtype
        nbytes = int(a.size) * dtype.itemsize
        head = _raw_head(name, dtype, a.shape, nbytes)
        heads.append((head, a, None if base is None else np.asarray(base[name])))
        size += len(head) + nbytes
    out = alloc(size)  # every byte is written below
    view, pos = memoryview(out), 0
    for head, a, b in heads:
        view[pos : pos + len(head)] = head
        pos += len(head)
        dtype = b.dtype if b is not None else a.dtype
        n = int(a.size) * dtype.itemsize
        dest = np.frombuffer(view[pos : pos + n], dtype.newbyteorder("<")).reshape(a.shape)
        if b is not None:
            np.subtract(a, b, out=dest, casting="same_kind")
        else:
            np.copyto(dest, a, casting="no" if dtype.isnative else "equiv")
        pos += n
    return out


def encode_update(
    update: Mapping[str, np.ndarray],
    *,
    compression: tuple[str, ...] | list[str] = (),
    topk_ratio: float = 0.01,
) -> bytes:
    """Serialize named float arrays as a TensorBundle, compressed as asked."""
    unknown = sorted(set(compression) - set(COMPRESSIONS))
    if unknown:
        raise ConfigError(f"unknown compression {unknown}; supported: {list(COMPRESSIONS)}")
    if not 0.0 < topk_ratio <= 1.0:
        raise ConfigError(f"`topk_ratio` must be in (0, 1], got {topk_ratio}")
    if not compression:
        return bytes(encode_raw(update))
    bundle = pb.TensorBundle()
    for name, value in update.items():
        a = np.asarray(value, order="C")  # ascontiguousarray would make a 0-d value 1-d
        t = bundle.tensors.add(name=name, dtype=a.dtype.name, shape=list(a.shape))
        flat = a.reshape(-1)
        if "topk" in compression:
            k = max(1, math.ceil(topk_ratio * flat.size)) if flat.size else 0
            idx = (
                np.sort(np.argpartition(np.abs(flat), flat.size - k)[flat.size - k :])
                if k
                else flat[:0]
            )
            t.indices = idx.astype("<u4").tobytes()
            values = flat[idx]
            if "int8" in compression:
                t.encoding = pb.ENCODING_TOPK_INT8
                t.data, t.scale = _quantize_int8(values)
            else:
                t.encoding = pb.ENCODING_TOPK
                t.data = values.astype("<f4").tobytes()
        elif "int8" in compression:
            t.encoding = pb.ENCODING_INT8
            t.data, t.scale = _quantize_int8(flat)
        else:
            t.encoding = pb.ENCODING_RAW
            t.data = flat.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return bundle.SerializeToString()


Payload = bytes | bytearray | memoryview | mmap.mmap


def decode_update(payload: Payload, template: Template) -> Weights:
    """Parse and decode a TensorBundle against the model's template.

    Checks the set of names, each shape and dtype, and the byte lengths and positions of
    compressed encodings; does not check finiteness (see validation.validate_update).
    A payload laid out byte for byte as `encode_raw` writes the template's tensors (what
    every client sends uncompressed) is cut at known offsets, without parsing.
    """
    fast = _raw_layout(template).cut(payload)
    if fast is not None:
        return fast
    tensors = _parse_bundle(payload)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UpdateRejectedError(f"update names tensors more than once: {dup}")
    missing, unknown = sorted(set(template) - set(names)), sorted(set(names) - set(template))
    if missing or unknown:
        raise UpdateRejectedError(
            f"update tensors do not match the model: missing {missing}, unknown {unknown}"
        )
    out: Weights = {}
    for t in tensors:
        shape, dtype = template[t.name]
        if tuple(t.shape) != shape or t.dtype != dtype_name(dtype):
            raise UpdateRejectedError(
                f"tensor {t.name!r}: expected {dtype.name}{list(shape)}, "
                f"got {t.dtype}{list(t.shape)}"
            )
        out[t.name] = _decode_tensor(t, shape, dtype)
    return out


class _RawLayout:
    """Where `encode_raw` puts each tensor of a template: the bytes before each tensor's
    data, and the data's place. A payload whose length and head bytes all match holds
    exactly these tensors, as the parser would find them."""

    __slots__ = ("heads", "size", "tensors")

    def __init__(self, template: Template) -> None:
        self.heads: list[tuple[int, bytes]] = []
        self.tensors: list[tuple[str, int, int, np.dtype, np.dtype, tuple[int, ...]]] = []
        pos = 0
        for name, (shape, dtype) in template.items():
            nbytes = math.prod(shape) * dtype.itemsize
            head = _raw_head(name, dtype, shape, nbytes)
            self.heads.append((pos, head))
            pos += len(head)
            self.tensors.append((name, pos, pos + nbytes, _little_endian(dtype), dtype, shape))
            pos += nbytes
        self.size = pos

    def cut(self, payload: Payload) -> Weights | None:
        """The tensors, views of `payload`, if it has this layout; else None."""
        buf = memoryview(payload)
        if buf.nbytes != self.size or buf.ndim != 1 or buf.itemsize != 1:
            return None
        for pos, head in self.heads:
            if buf[pos : pos + len(head)] != head:
                return None
        return {
            name: np.frombuffer(buf[start:end], wire).astype(dtype, copy=False).reshape(shape)
            for name, start, end, wire, dtype, shape in self.tensors
        }


# The layouts of the last few templates, by identity: a job's template changes only when
# its model does, and every update of a round is decoded against the same one.
_LAYOUTS: dict[int, tuple[Template, _RawLayout]] = {}
_LAYOUTS_KEPT = 8


def _raw_layout(template: Template) -> _RawLayout:
    kept = _LAYOUTS.get(id(template))
    if kept is not None and kept[0] is template:
        return kept[1]
    layout = _RawLayout(template)
    if len(_LAYOUTS) >= _LAYOUTS_KEPT:
        _LAYOUTS.clear()
    _LAYOUTS[id(template)] = (template, layout)
    return layout


_EMPTY = memoryview(b"")


@functools.lru_cache(maxsize=64)
def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, which NumPy works out in Python on every access: asked per tensor."""
    return dtype.name


@functools.lru_cache(maxsize=64)
def _little_endian(dtype: np.dtype) -> np.dtype:
    """`dtype` in little-endian byte order (the wire's), made once per dtype."""
    return dtype.newbyteorder("<")


class _Tensor:
    """A NamedTensor whose byte fields are views into the payload (no copies)."""

    __slots__ = ("data", "dtype", "encoding", "indices", "name", "scale", "shape")

    def __init__(self) -> None:
        self.name = self.dtype = ""
        self.shape: list[int] = []
        self.encoding = 0
        self.data = self.indices = _EMPTY
        self.scale = 0.0


class MalformedPayload(Exception):
    """Protobuf wire bytes that do not parse (mapped to UpdateRejectedError by callers)."""


def read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the protobuf varint at `pos`, read no further than `end`."""
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise MalformedPayload("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _field(buf: memoryview, pos: int, end: int) -> tuple[int, int, Any, int]:
    """(field number, wire type, value, next position); length-delimited values are views."""
    key, pos = read_varint(buf, pos, end)
    number, wire = key >> 3, key & 7
    value: int | memoryview
    if wire == 0:
        value, pos = read_varint(buf, pos, end)
    elif wire == 2:
        length, pos = read_varint(buf, pos, end)
        if pos + length > end:
            raise MalformedPayload(f"field {number} runs past its message")
        value, pos = buf[pos : pos + length], pos + length
    elif wire in (1, 5):
        width = 8 if wire == 1 else 4
        if pos + width > end:
            raise MalformedPayload(f"field {number} runs past its message")
        value, pos = buf[pos : pos + width], pos + width
    else:
        raise MalformedPayload(f"unsupported wire type {wire}")
    if number == 0:
        raise MalformedPayload("field number 0")
    return number, wire, value, pos


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _parse_bundle(payload: Payload) -> list[_Tensor]:
    """The tensors of a TensorBundle, read in proto3 wire format without copying data.

    Hand-written because protobuf would copy every tensor's bytes twice (parsing, then
    reading the field); `encode_update` with compression still builds bundles with
    protobuf, and the unit tests check both agree.
    """
    buf = memoryview(payload)
    tensors: list[_Tensor] = []
    try:
        pos = 0
        while pos < len(buf):
            number, wire, value, pos = _field(buf, pos, len(buf))
            if number == 1 and wire == 2:
                tensors.append(_parse_tensor(value))
            # any other field: skipped, as protobuf does
    except (MalformedPayload, UnicodeDecodeError) as e:
        raise UpdateRejectedError(f"update is not a valid TensorBundle: {e}") from None
    return tensors


def _parse_tensor(v: memoryview) -> _Tensor:
    """One NamedTensor. Its keys and most of its lengths are one-byte varints, read
    inline: every accepted update passes here, once per tensor."""
    t, pos, end = _Tensor(), 0, len(v)
    value: Any  # a view (length-delimited fields) or an int (varints)
    while pos < end:
        key = v[pos]
        if 7 < key < 0x80 and key & 7 == 2 and pos + 1 < end and v[pos + 1] < 0x80:
            length, pos = v[pos + 1], pos + 2  # a short length-delimited field
            if pos + length > end:
                raise MalformedPayload(f"field {key >> 3} runs past its message")
            n, w, value, pos = key >> 3, 2, v[pos : pos + length], pos + length
        else:
            n, w, value, pos = _field(v, pos, end)
        if n == 1 and w == 2:
            t.name = bytes(value).decode()
        elif n == 2 and w == 2:
            t.dtype = bytes(value).decode()
        elif n == 3 and w == 2:  # packed int64
            t.shape.extend(_packed_int64(value))
        elif n == 3 and w == 0:
            t.shape.append(_int64(value))
        elif n == 4 and w == 0:
            t.encoding = value
        elif n == 5 and w == 2:
            t.data = value
        elif n == 6 and w == 5:
            t.scale = struct.unpack("<f", value)[0]
        elif n == 7 and w == 2:
            t.indices = value
    return t


def _packed_int64(v: memoryview) -> list[int]:
    """The values of a packed int64 field (a shape: one-byte varints, mostly)."""
    raw = v.tobytes()
    if raw.isascii():  # every value a one-byte varint: the common case
        return list(raw)
    out: list[int] = []
    p, end = 0, len(v)
    while p < end:
        b = v[p]
        if b < 0x80:
            out.append(b)
            p += 1
        else:
            d, p = read_varint(v, p, end)
            out.append(_int64(d))
    return out


def _decode_tensor(t: _Tensor, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    size = math.prod(shape)

    def expect_len(what: str, got: int, want: int) -> None:
        if got != want:
            raise UpdateRejectedError(f"tensor {t.name!r}: {what} is {got} bytes, expected {want}")

    def check_scale() -> float:
        if not (math.isfinite(t.scale) and t.scale >= 0):
            raise UpdateRejectedError(
                f"tensor {t.name!r}: int8 scale must be finite and >= 0, got {t.scale}"
            )
        return float(t.scale)

    if t.encoding == pb.ENCODING_RAW:
        data = t.data
        expect_len("data", len(data), size * dtype.itemsize)
        # A read-only view of the payload on little-endian hosts (no copy); aggregation
        # only reads it.
        return np.frombuffer(data, _little_endian(dtype)).astype(dtype, copy=False).reshape(shape)
    if t.encoding == pb.ENCODING_INT8:
        expect_len("int8 data", len(t.data), size)
        q = np.frombuffer(t.data, np.int8)
        return (q.astype(np.float32) * check_scale()).astype(dtype).reshape(shape)
    if t.encoding in (pb.ENCODING_TOPK, pb.ENCODING_TOPK_INT8):
        if len(t.indices) % 4:
            raise UpdateRejectedError(
                f"tensor {t.name!r}: top-k indices are not whole uint32 values"
            )
        idx = np.frombuffer(t.indices, "<u4")
        if idx.size > size or (idx.size and int(idx.max()) >= size):
            raise UpdateRejectedError(
                f"tensor {t.name!r}: top-k positions out of range for {size} values"
            )
        if t.encoding == pb.ENCODING_TOPK:
            expect_len("top-k values", len(t.data), idx.size * 4)
            values = np.frombuffer(t.data, "<f4")
        else:
            expect_len("top-k int8 values", len(t.data), idx.size)
            values = np.frombuffer(t.data, np.int8).astype(np.float32) * check_scale()
        dense = np.zeros(size, dtype)
        dense[idx] = values
        return dense.reshape(shape)
    raise UpdateRejectedError(f"tensor {t.name!r}: unknown encoding {t.encoding}")
