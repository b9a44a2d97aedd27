"""Tensor data read in place: the `raw_data` of a model's tensors stays in the file's bytes,
found at the protobuf wire level, and only the rest of the model is parsed.

Parsing a whole ONNX file holds its weights twice (the file's bytes and the parsed
message), and reading them out as arrays a third time. Here the caller maps the file into
memory; every large `raw_data` (initializers and Constant values, in subgraphs too) is
replaced in the bytes that get parsed by a reference to its span of the file, ONNX's
external-data fields with the location `IN_PLACE`, and `tensor_value` reads it as a
NumPy view of the mapping: no copy, its pages read when the weights are written out.

Only the wire layout ONNX writes is handled; anything the scan does not expect raises
WireError, and the caller parses the file as usual.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

IN_PLACE = "<sporenet:in-place>"
"""The external-data location of a tensor whose data is a span of the model's own bytes."""

MIN_IN_PLACE_BYTES = 256
"""Smaller raw_data stays in the parsed message (not worth a view of its own)."""

_LEN = 2  # wire type of length-delimited fields
# Field numbers (onnx.proto) of the messages that can hold tensors.
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_ATTRIBUTE = 5
_ATTR_TENSOR, _ATTR_GRAPH, _ATTR_TENSORS, _ATTR_GRAPHS = 5, 6, 10, 11
_TENSOR_DATA_TYPE, _TENSOR_RAW_DATA = 2, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 13, 14
_PACKED_AS_RAW = {4: onnx.TensorProto.FLOAT, 10: onnx.TensorProto.DOUBLE}  # field -> type
_ENTRY_KEY, _ENTRY_VALUE = 1, 2

Parts = list[bytes | memoryview]
# A message's rewriter: buf, start, end -> the rewritten parts, or None if unchanged.
Rewriter = Callable[[memoryview, int, int], Parts | None]


class WireError(ValueError):
    """The bytes do not have the wire layout the in-place reader expects."""


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, value end) of each field of the
    message at buf[start:end]; a length-delimited value excludes its length prefix."""
    pos = start
    while pos < end:
        key, value_start = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, value_end = _varint(buf, value_start)
        elif wire == 1:
            value_end = value_start + 8
        elif wire == 5:
            value_end = value_start + 4
        elif wire == _LEN:
            length, value_start = _varint(buf, value_start)
            value_end = value_start + length
        else:
            raise WireError(f"wire type {wire} (groups are not written by ONNX)")
        if value_end > end or number == 0:
            raise WireError("a field runs past its message")
        yield number, wire, pos, value_start, value_end
        pos = value_end


def _field(number: int, parts: Parts) -> Parts:
    """A length-delimited field `number` holding the concatenation of `parts`."""
    size = sum(len(p) for p in parts)
    return [_encode_varint(number << 3 | _LEN), _encode_varint(size), *parts]


def _entry(key: str, value: str) -> Parts:
    inner = _field(_ENTRY_KEY, [key.encode()]) + _field(_ENTRY_VALUE, [value.encode()])
    return _field(_TENSOR_EXTERNAL_DATA, inner)


def _tensor(buf: memoryview, start: int, end: int) -> Parts | None:
    """The TensorProto at buf[start:end] with its raw_data replaced by an in-place
    reference, or None to keep it as it is."""
    kept: Parts = []
    raw: tuple[int, int] | None = None
    packed: dict[int, tuple[int, int, int]] = {}  # field -> (kept position, start, length)
    data_type = 0
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end):
        if number in (_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION):
            return None  # already external: the loader reads it from its file
        if number == _TENSOR_DATA_TYPE and wire == 0:
            data_type = _varint(buf, value_start)[0]
        if number == _TENSOR_RAW_DATA and wire == _LEN:
            raw = (value_start, value_end - value_start)
            continue
        if number in _PACKED_AS_RAW and wire == _LEN:
            packed[number] = (len(kept), value_start, value_end - value_start)
        kept.append(buf[field_start:value_end])
    # float_data and double_data, packed, are the little-endian values raw_data would hold.
    field = next((f for f, t in _PACKED_AS_RAW.items() if t == data_type), None)
    if raw is None and field in packed and len(packed) == 1:
        position, *span = packed[field]
        raw = (span[0], span[1])
        del kept[position]
    if raw is None or raw[1] < MIN_IN_PLACE_BYTES:
        return None
    kept += _entry("location", IN_PLACE) + _entry("offset", str(raw[0]))
    kept += _entry("length", str(raw[1]))
    kept += [_encode_varint(_TENSOR_DATA_LOCATION << 3), _encode_varint(onnx.TensorProto.EXTERNAL)]
    return kept


# Which fields of each message hold which messages: field number -> rewriter.
def _rewrite(
    buf: memoryview, start: int, end: int, children: Mapping[int, Rewriter]
) -> Parts | None:
    """The message at buf[start:end] with its tensors rewritten, or None if none was.
    Fields kept as they are go in as one slice per run between rewritten ones: ONNX's
    repeated integers are not packed, so a tree ensemble's node lists are hundreds of
    thousands of fields, and a slice each would hold far more memory than the file."""
    parts: Parts = []
    kept_from = start  # where the run of fields kept as they are began
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end):
        inner = children.get(number) if wire == _LEN else None
        new = inner(buf, value_start, value_end) if inner is not None else None
        if new is not None:
            if kept_from < field_start:
                parts.append(buf[kept_from:field_start])
            parts += _field(number, new)
            kept_from = value_end
    if kept_from == start:
        return None
    if kept_from < end:
        parts.append(buf[kept_from:end])
    return parts


def _graph(buf: memoryview, start: int, end: int) -> Parts | None:
    return _rewrite(buf, start, end, {_GRAPH_NODE: _node, _GRAPH_INITIALIZER: _tensor})


def _node(buf: memoryview, start: int, end: int) -> Parts | None:
    return _rewrite(buf, start, end, {_NODE_ATTRIBUTE: _attribute})


def _attribute(buf: memoryview, start: int, end: int) -> Parts | None:
    children = {_ATTR_TENSOR: _tensor, _ATTR_TENSORS: _tensor}
    children |= {_ATTR_GRAPH: _graph, _ATTR_GRAPHS: _graph}
    return _rewrite(buf, start, end, children)


def split_in_place(data: memoryview) -> bytes | None:
    """The serialized model `data` with every large raw_data replaced by a reference to
    its span of `data`, or None when no tensor qualifies. Raises WireError on a layout it
    does not expect."""
    buf = data.cast("B") if data.format != "B" else data
    parts = _rewrite(buf, 0, len(buf), {_MODEL_GRAPH: _graph})
    return None if parts is None else b"".join(parts)


TensorBytes = Mapping[str, memoryview]
"""Where external tensor data lies: external-data location -> that file's bytes (mapped),
IN_PLACE -> the model's own bytes."""


def external_ref(tensor: onnx.TensorProto) -> tuple[str, int, int | None] | None:
    """(location, offset, length or None for "to the end") of a tensor whose data is
    external (in another file, or in place in the model's bytes), else None.
    Raises ValueError for an offset or length that is not a non-negative integer."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    entries = {e.key: e.value for e in tensor.external_data}
    try:
        offset = int(entries.get("offset") or 0)
        length = int(entries["length"]) if entries.get("length") else None
    except ValueError:
        raise ValueError(
            f"external-data offset {entries.get('offset')!r} / length "
            f"{entries.get('length')!r} are not integers"
        ) from None
    if offset < 0 or (length is not None and length < 0):
        raise ValueError(f"negative external-data offset {offset} or length {length}")
    return entries.get("location", ""), offset, length


def in_place_span(tensor: onnx.TensorProto) -> tuple[int, int] | None:
    """(offset, length) of a tensor's data in the model's bytes, if it is read in place."""
    ref = external_ref(tensor)
    if ref is None or ref[0] != IN_PLACE or ref[2] is None:
        return None
    return ref[1], ref[2]


def _as_bytes(data: TensorBytes | memoryview | None) -> TensorBytes:
    if data is None:
        return {}
    return {IN_PLACE: data} if isinstance(data, memoryview) else data


def _span(tensor: onnx.TensorProto, data: TensorBytes) -> tuple[memoryview, int, int] | None:
    """(bytes, offset, length) of an external tensor's data, or None if it is not
    external. Raises ValueError when its bytes are not at hand or too short."""
    ref = external_ref(tensor)
    if ref is None:
        return None
    location, offset, length = ref
    buf = data.get(location)
    if buf is None:
        where = "the model's bytes" if location == IN_PLACE else f"external file {location!r}"
        raise ValueError(f"its data lies in {where}, which was not read")
    if length is None:
        length = len(buf) - offset
    if offset + length > len(buf):
        raise ValueError(
            f"it needs bytes {offset}..{offset + length} of {location!r}, which holds only "
            f"{len(buf)}"
        )
    return buf, offset, length


def tensor_value(tensor: onnx.TensorProto, data: TensorBytes | memoryview | None) -> np.ndarray:
    """A tensor's value: a read-only view of the mapped bytes its data lies in (the
    model's own, for data read in place, or an external-data file), else ONNX's own
    reading. `data` maps locations to bytes (a bare memoryview: the model's bytes).
    Raises ValueError for unreadable data."""
    span = _span(tensor, _as_bytes(data))
    if span is None:
        return numpy_helper.to_array(tensor)
    buf, offset, length = span
    dims = tuple(tensor.dims)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    if math.prod(dims) * dtype.itemsize != length:
        # Packed (4-bit) types, or a size that does not match: ONNX's reading decides.
        return numpy_helper.to_array(_inline(tensor, buf, offset, length))
    array = np.frombuffer(buf, dtype, math.prod(dims), offset).reshape(dims)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _inline(
    tensor: onnx.TensorProto, buf: memoryview, offset: int, length: int
) -> onnx.TensorProto:
    whole = onnx.TensorProto()
    whole.CopyFrom(tensor)
    del whole.external_data[:]
    whole.data_location = onnx.TensorProto.DEFAULT
    whole.raw_data = bytes(buf[offset : offset + length])
    return whole


def materialize(model: onnx.ModelProto, data: TensorBytes | memoryview) -> None:
    """Put the data of every external tensor of `model` whose bytes are at hand back into
    the message (for tools that read tensors from the message itself, such as ONNX's
    version converter)."""
    from onnx import external_data_helper

    data = _as_bytes(data)
    for tensor in external_data_helper._get_all_tensors(model):
        span = _span(tensor, data)
        if span is not None:
            tensor.CopyFrom(_inline(tensor, *span))
