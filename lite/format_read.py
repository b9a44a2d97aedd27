"""Reading .spore files as hostile input.

The FlatBuffer is read by direct offset arithmetic (lite/format_flat.py). Every vector
length is checked against the bytes that could hold it before anything is iterated or
allocated, and every low-level failure is turned into one ModelFormatError that says what
was wrong. Weights are returned as read-only NumPy views of the file (zero-copy; with mmap
they are paged in lazily).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.lite import lowp, sparse, strings
from sporenet.lite.dtypes import STRING, to_numpy_dtype
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.format_flat import FlatReader
from sporenet.lite.format_layout import FILE_IDENTIFIER, SCHEMA_VERSION, Source
from sporenet.lite.format_layout import MAX_RANK as _MAX_RANK
from sporenet.lite.graph import Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.lite.ops import OpCode
from sporenet.proto import model_generated as fb

# Field counts of the schema's tables (proto/model.fbs), in declaration order.
_MODEL_FIELDS, _GRAPH_FIELDS, _NODE_FIELDS, _ATTR_FIELDS = 9, 4, 6, 7
_TENSOR_FIELDS, _QUANT_FIELDS, _SIGNATURE_FIELDS, _PAIR_FIELDS, _BUFFER_FIELDS = 8, 5, 6, 2, 2
_I8, _I32, _I64, _U64, _F64 = "<b", "<i", "<q", "<Q", "<d"
_F32, _INT64 = np.dtype("<f4"), np.dtype("<i8")  # quantization vectors, as in the file


def _as_buffer(source: Source, use_mmap: bool) -> bytes | memoryview | mmap.mmap:
    if isinstance(source, bytes | bytearray | memoryview):
        return memoryview(source).cast("B") if not isinstance(source, bytes) else source
    path = Path(os.fspath(source))
    try:
        if not use_mmap:
            return path.read_bytes()
        with path.open("rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return b""
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise FileNotFoundError(f"model file not found: {path}") from None
    # Pages, not huge pages: dropping the pages of a weight a kernel replaced
    # (lite/pages.py) would otherwise unmap the whole 2 MB page it shares with the weights
    # kept, and their next read would map it back, the dropped weight included.
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        # (A kernel built without transparent huge pages refuses the advice: nothing to do.)
        with contextlib.suppress(OSError):
            mapped.madvise(advice)
    return mapped


def _constant(
    r: FlatReader,
    what: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    buffer_index: int,
    span: tuple[int, int],
) -> np.ndarray:
    """The read-only array of a dense constant: a view of the file's bytes when aligned."""
    if -1 in shape:
        raise ModelFormatError(f"{what}: a constant tensor needs a static shape, got {shape}")
    offset, size = span
    count = math.prod(shape)
    if dtype == STRING:
        # Python objects per element: charged to the work budget like any table entry.
        r.spend(count + size // 16 + 1, what)
        return strings.decode(memoryview(r.buf)[offset : offset + size], shape, what)
    packed = lowp.lowp_type(dtype)
    if packed is not None and packed.bits < 8:
        expected = lowp.packed_size(count, dtype)
        if size != expected:
            raise ModelFormatError(
                f"{what}: buffer {buffer_index} holds {size} bytes but shape {shape} x "
                f"{packed.name} (packed, {packed.bits} bits each) needs {expected}"
            )
        r.spend(count // 4 + 1, what)  # unpacking writes one byte per element
        data = lowp.unpack(memoryview(r.buf)[offset : offset + size], shape, dtype)
        data.flags.writeable = False
        return data
    expected = count * dtype.itemsize
    if size != expected:
        raise ModelFormatError(
            f"{what}: buffer {buffer_index} holds {size} bytes but shape {shape} x "
            f"{dtype} needs {expected}"
        )
    if offset % dtype.itemsize:
        # A misaligned buffer is copied; many tensors sharing one must not multiply that.
        r.spend(size // 4 + 1, what)
        raw = bytes(memoryview(r.buf)[offset : offset + size])
        data = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
    else:
        # One array object, not a flat view and its reshaped view.
        data = np.ndarray(shape, dtype, r.buf, offset)
    data.flags.writeable = False
    return data


def _quantization(r: FlatReader, pos: int, what: str) -> Quantization:
    scale, zero_point, axis, qmin, qmax = r.table(pos, _QUANT_FIELDS, what)
    lo = r.array(qmin, _F32, what + " min")
    hi = r.array(qmax, _F32, what + " max")
    return Quantization(
        scale=r.array(scale, _F32, what + " scale"),
        zero_point=r.array(zero_point, _INT64, what + " zero_point"),
        axis=r.scalar(axis, _I32),
        min=lo if lo.size else None,
        max=hi if hi.size else None,
    )


def _parse_tensor(r: FlatReader, pos: int, index: int, buffers: list[tuple[int, int]]) -> Tensor:
    what = f"tensor {index}"
    # A table costs budget too: many entries pointing at one tiny table would otherwise
    # build many Python objects from a few bytes (an honest tensor table is >= 16 bytes).
    r.spend(4, what)
    f_name, f_dtype, f_shape, f_buffer, f_quant, f_sparse, f_trainable, f_dims = r.table(
        pos, _TENSOR_FIELDS, what
    )
    name = r.string(f_name, what)
    what = f"tensor {index} ({name!r})"
    dtype = to_numpy_dtype(r.scalar(f_dtype, _I8))
    shape = tuple(r.ints(f_shape, 8, what + " shape"))
    if len(shape) > _MAX_RANK:
        raise ModelFormatError(f"{what}: rank {len(shape)} exceeds the maximum {_MAX_RANK}")
    if shape and min(shape) < -1:
        raise ModelFormatError(f"{what}: shape {shape} has a negative dimension other than -1")
    buffer_index = r.u32(f_buffer)
    if buffer_index >= len(buffers):
        raise ModelFormatError(
            f"{what}: buffer index {buffer_index} out of range (the model has {len(buffers)})"
        )
    data = None
    if f_sparse:
        if buffer_index == 0 or -1 in shape:
            raise ModelFormatError(f"{what}: a sparse tensor must be a constant of static shape")
        if dtype == STRING or lowp.is_lowp(dtype):
            raise ModelFormatError(f"{what}: a {dtype} tensor cannot be stored sparse")
        data = _sparse(r, r.target(f_sparse), what, dtype, shape, buffers[buffer_index], buffers)
    elif buffer_index != 0:
        data = _constant(r, what, dtype, shape, buffer_index, buffers[buffer_index])
    dim_names = tuple(
        r.string_at(p, what + " dim_names") for p in r.tables(f_dims, what + " dim_names")
    )
    if dim_names and len(dim_names) != len(shape):
        raise ModelFormatError(
            f"{what}: {len(dim_names)} dimension names for a rank-{len(shape)} shape"
        )
    return Tensor(
        name=name,
        dtype=dtype,
        shape=shape,
        data=data,
        quantization=_quantization(r, r.target(f_quant), what) if f_quant else None,
        sparsity=sparse.bitmask(shape) if f_sparse else None,
        trainable=bool(r.scalar(f_trainable, _I8)),
        dim_names=dim_names,
    )


def _sparse(
    r: FlatReader,
    pos: int,
    what: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    values: tuple[int, int],
    buffers: list[tuple[int, int]],
) -> np.ndarray:
    """A BITMASK tensor expanded by lite/sparse.py (rare: read through the generated
    accessors, its vectors through the checked reader)."""
    table = fb.SparsityParams()
    table.Init(r.buf, pos)

    def ints(t: Any, slot: int, getter: str, elem_size: int, what: str) -> list[int]:
        return r.ints(r.table(t._tab.Pos, slot + 1, what)[slot], elem_size, what)

    return sparse.read(
        table,
        what=what,
        dtype=dtype,
        shape=shape,
        values=values,
        buffers=buffers,
        buf=r.buf,
        spend=r.spend,
        ints=ints,
    )


def _parse_attribute(r: FlatReader, pos: int, what: str) -> tuple[str, Any]:
    f_name, f_kind, f_i, f_f, f_s, f_ints, f_floats = r.table(pos, _ATTR_FIELDS, what)
    # Interned: every node repeats a few names ("pads", "strides"), one string each.
    name = sys.intern(r.string(f_name, what + " attribute name"))
    kind = r.scalar(f_kind, _I8)
    what = f"{what} attribute {name!r}"
    if kind == fb.AttrKind.INT:
        return name, r.scalar(f_i, _I64)
    if kind == fb.AttrKind.FLOAT:
        return name, float(r.scalar(f_f, _F64, 0.0))
    if kind == fb.AttrKind.STRING:
        return name, sys.intern(r.string(f_s, what))  # a few values ("relu", "SAME")
    if kind == fb.AttrKind.INTS:
        return name, r.ints(f_ints, 8, what)
    if kind == fb.AttrKind.FLOATS:
        return name, r.floats(f_floats, 8, what)
    raise ModelFormatError(f"{what}: unknown attribute kind {kind}")


_OPS = {int(op): op for op in OpCode}


def _parse_node(r: FlatReader, pos: int, where: str) -> Node:
    f_op, f_version, f_inputs, f_outputs, f_attrs, f_name = r.table(pos, _NODE_FIELDS, where)
    code = r.scalar(f_op, _I32)
    op = _OPS.get(code)
    if op is None:
        raise ModelFormatError(f"{where}: unknown op code {code}")
    what = f"{where} ({op.name})"
    r.spend(4, what)  # as for tensors: an honest node table is >= 16 bytes
    inputs = r.ints(f_inputs, 4, what + " inputs")
    outputs = r.ints(f_outputs, 4, what + " outputs")
    attrs: dict[str, Any] = {}
    for p in r.tables(f_attrs, what + " attributes"):
        key, value = _parse_attribute(r, p, what)
        attrs[key] = value
    return Node(
        op=op,
        inputs=inputs,
        outputs=outputs,
        attrs=attrs,
        version=r.scalar(f_version, _I32, 1),
        name=r.string(f_name, what + " name"),
    )


def _parse_graph(r: FlatReader, pos: int, gi: int) -> Graph:
    f_name, f_inputs, f_outputs, f_nodes = r.table(pos, _GRAPH_FIELDS, f"graph {gi}")
    name = r.string(f_name, f"graph {gi} name")
    nodes = [
        _parse_node(r, p, f"graph {gi} node {j}")
        for j, p in enumerate(r.tables(f_nodes, f"graph {gi} nodes"))
    ]
    return Graph(
        name=name,
        inputs=r.ints(f_inputs, 4, f"graph {gi} inputs"),
        outputs=r.ints(f_outputs, 4, f"graph {gi} outputs"),
        nodes=nodes,
    )


def _parse_signature(r: FlatReader, pos: int, si: int) -> Signature:
    what = f"signature {si}"
    f_key, f_graph, f_in_names, f_in, f_out_names, f_out = r.table(pos, _SIGNATURE_FIELDS, what)
    in_names = [r.string_at(p, what) for p in r.tables(f_in_names, what + " input names")]
    out_names = [r.string_at(p, what) for p in r.tables(f_out_names, what + " output names")]
    in_tensors = r.ints(f_in, 4, what + " input tensors")
    out_tensors = r.ints(f_out, 4, what + " output tensors")
    if len(in_names) != len(in_tensors) or len(out_names) != len(out_tensors):
        raise ModelFormatError(f"{what}: names and tensor lists differ in length")
    return Signature(
        key=r.string(f_key, what + " key"),
        graph=r.u32(f_graph),
        inputs=dict(zip(in_names, in_tensors, strict=True)),
        outputs=dict(zip(out_names, out_tensors, strict=True)),
    )


def _parse_buffers(r: FlatReader, at: int) -> list[tuple[int, int]]:
    buffers: list[tuple[int, int]] = []
    for i, pos in enumerate(r.tables(at, "buffer table")):
        f_offset, f_size = r.table(pos, _BUFFER_FIELDS, f"buffer {i}")
        offset, length = r.scalar(f_offset, _U64), r.scalar(f_size, _U64)
        if offset + length > r.size:
            raise ModelFormatError(
                f"buffer {i}: bytes {offset}..{offset + length} lie outside the {r.size}-byte file"
            )
        buffers.append((offset, length))
    if buffers and buffers[0][1] != 0:
        raise ModelFormatError("buffer 0 must be the empty sentinel")
    return buffers or [(0, 0)]


def _foreign(buf: Any) -> str:
    """What a file that is not a .spore model seems to be, and what to do with it."""
    convert = "convert it with `sporenet-convert MODEL -o model.spore`"
    if bytes(buf[4:8]) == b"TFL3":
        return f"this is a TFLite model: {convert}"
    # An ONNX ModelProto starts with field 1 (ir_version, a varint: tag 0x08), then a
    # small version number.
    if buf[0] == 0x08 and buf[1] < 0x20:
        return f"this looks like an ONNX model: {convert}"
    return "not a .spore model"


def _parse(buf: Any) -> Model:
    size = len(buf)
    if size < 8:
        raise ModelFormatError(f"file is {size} bytes; a model file is at least 8 bytes")
    ident = bytes(buf[4:8])
    if ident != FILE_IDENTIFIER:
        raise ModelFormatError(
            f"file identifier is {ident!r}, expected {FILE_IDENTIFIER!r} ({_foreign(buf)})"
        )
    root = struct.unpack_from("<I", buf, 0)[0]
    if root + 4 > size:
        raise ModelFormatError(f"root table offset {root} lies outside the {size}-byte file")
    r = FlatReader(buf)
    (
        f_version,
        f_producer,
        f_producer_version,
        f_description,
        f_graphs,
        f_tensors,
        f_buffers,
        f_signatures,
        f_metadata,
    ) = r.table(root, _MODEL_FIELDS, "model")
    version = r.u32(f_version)
    if version > SCHEMA_VERSION or version == 0:
        raise ModelFormatError(
            f"schema version {version} is not supported; this runtime reads 1..{SCHEMA_VERSION}"
        )
    buffers = _parse_buffers(r, f_buffers)
    tensors = [
        _parse_tensor(r, p, i, buffers) for i, p in enumerate(r.tables(f_tensors, "tensor table"))
    ]
    graphs = [_parse_graph(r, p, gi) for gi, p in enumerate(r.tables(f_graphs, "graph list"))]
    signatures: dict[str, Signature] = {}
    for si, p in enumerate(r.tables(f_signatures, "signatures")):
        signature = _parse_signature(r, p, si)
        signatures[signature.key] = signature
    metadata = {}
    for ki, p in enumerate(r.tables(f_metadata, "metadata")):
        f_key, f_value = r.table(p, _PAIR_FIELDS, f"metadata {ki}")
        metadata[r.string(f_key, f"metadata {ki}")] = r.string(f_value, f"metadata {ki}")
    return Model(
        tensors=tensors,
        graphs=graphs,
        signatures=signatures,
        metadata=metadata,
        producer=r.string(f_producer, "producer"),
        producer_version=r.string(f_producer_version, "producer_version"),
        description=r.string(f_description, "description"),
    )


def parse(buf: bytes | memoryview | mmap.mmap, *, check: bool = True) -> Model:
    """Parse .spore bytes into a Model; any malformation raises ModelFormatError."""
    try:
        model = _parse(buf)
    except ModelFormatError:
        raise
    except (
        IndexError,
        struct.error,
        ValueError,
        TypeError,
        OverflowError,
        MemoryError,
        RecursionError,
        UnicodeDecodeError,
        AttributeError,
    ) as exc:
        raise ModelFormatError(
            f"file is truncated or corrupt: {type(exc).__name__}: {exc}"
        ) from None
    if check:
        from sporenet.lite.validate import validate

        validate(model)
    return model


def load(source: Source | Model, *, use_mmap: bool = True) -> Model:
    """Load a model from a path (memory-mapped by default), bytes, or pass a Model through."""
    if isinstance(source, Model):
        return source
    return parse(_as_buffer(source, use_mmap))
