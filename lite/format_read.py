"""Reading .spore files as hostile input.

Every vector length is checked against the bytes that could hold it before anything is
iterated or allocated, and every low-level failure is turned into one ModelFormatError
that says what was wrong. Weights are returned as read-only NumPy views of the file
(zero-copy; with mmap they are paged in lazily).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.lite import sparse
from sporenet.lite.dtypes import to_numpy_dtype
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.format_layout import FILE_IDENTIFIER, SCHEMA_VERSION, Source
from sporenet.lite.format_layout import MAX_RANK as _MAX_RANK
from sporenet.lite.graph import Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.lite.ops import OpCode
from sporenet.proto import model_generated as fb

_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}  # element size -> struct code (signed)
_FLOAT_CODES = {4: "f", 8: "d"}


class _Reader:
    """Walks a FlatBuffer through the generated accessors with bounds and work limits."""

    def __init__(self, buf: bytes | memoryview | mmap.mmap) -> None:
        self.buf = buf
        self.size = len(buf)
        # Bound on the elements (and 4-byte units of string) read in total, so offsets
        # shared by many tables cannot multiply the work or the memory. A vector of n
        # elements or a string of 4n bytes occupies at least 4(n + 1) bytes of the file, so
        # an honest file spends at most size/4; twice that leaves room for writers that
        # share strings.
        self.budget = self.size // 2 + 1024

    def check_vector(self, table: Any, slot: int, elem_size: int, what: str) -> int:
        """Length of the vector in field `slot` of `table`, checked against the buffer."""
        return self._vector(table, slot, elem_size, what)[0]

    def _vector(self, table: Any, slot: int, elem_size: int, what: str) -> tuple[int, int]:
        """(length, start) of the vector in field `slot` of `table`, checked."""
        tab = table._tab
        o = tab.Offset(4 + 2 * slot)
        if o == 0:
            return 0, 0
        start = tab.Vector(o)
        length = tab.VectorLen(o)
        if start < 0 or start + length * elem_size > self.size:
            raise ModelFormatError(
                f"{what}: vector of {length} elements at offset {start} runs past the end "
                f"of the {self.size}-byte file"
            )
        self.spend(length + 1, what)
        return length, start

    def spend(self, units: int, what: str) -> None:
        self.budget -= units
        if self.budget < 0:
            raise ModelFormatError(f"{what}: file references far more data than it holds")

    # The vectors are read straight from the checked span (the generated accessors would
    # look the field up again and build a NumPy array per vector, a large share of a
    # model's load time). `getter` names the field for readers of the schema.
    def ints(self, table: Any, slot: int, getter: str, elem_size: int, what: str) -> list[int]:
        n, start = self._vector(table, slot, elem_size, what)
        if n == 0:
            return []
        return list(struct.unpack_from(f"<{n}{_INT_CODES[elem_size]}", self.buf, start))

    def floats(self, table: Any, slot: int, getter: str, elem_size: int, what: str) -> list[float]:
        n, start = self._vector(table, slot, elem_size, what)
        if n == 0:
            return []
        return list(struct.unpack_from(f"<{n}{_FLOAT_CODES[elem_size]}", self.buf, start))

    def string(self, raw: bytes | None, what: str) -> str:
        if raw is None:
            return ""
        if len(raw) > self.size:
            raise ModelFormatError(f"{what}: string longer than the file")
        self.spend(len(raw) // 4 + 1, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"{what}: string is not valid UTF-8 ({exc})") from None


def _as_buffer(source: Source, use_mmap: bool) -> bytes | memoryview | mmap.mmap:
    if isinstance(source, bytes | bytearray | memoryview):
        return memoryview(source).cast("B") if not isinstance(source, bytes) else source
    path = Path(os.fspath(source))
    try:
        if use_mmap:
            with path.open("rb") as fh:
                if os.fstat(fh.fileno()).st_size == 0:
                    return b""
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"model file not found: {path}") from None


def _parse_tensor(
    r: _Reader, t: Any, index: int, buffers: list[tuple[int, int]], buf: Any
) -> Tensor:
    what = f"tensor {index}"
    # A table costs budget too: many entries pointing at one tiny table would otherwise
    # build many Python objects from a few bytes (an honest tensor table is >= 16 bytes).
    r.spend(4, what)
    name = r.string(t.Name(), what)
    what = f"tensor {index} ({name!r})"
    dtype = to_numpy_dtype(t.Dtype())
    shape = tuple(r.ints(t, 2, "Shape", 8, what + " shape"))
    if len(shape) > _MAX_RANK:
        raise ModelFormatError(f"{what}: rank {len(shape)} exceeds the maximum {_MAX_RANK}")
    if any(d < -1 for d in shape):
        raise ModelFormatError(f"{what}: shape {shape} has a negative dimension other than -1")
    buffer_index = t.Buffer()
    if buffer_index >= len(buffers):
        raise ModelFormatError(
            f"{what}: buffer index {buffer_index} out of range (the model has {len(buffers)})"
        )
    data = None
    sparsity = t.Sparsity()
    if sparsity is not None:
        if buffer_index == 0 or -1 in shape:
            raise ModelFormatError(f"{what}: a sparse tensor must be a constant of static shape")
        data = sparse.read(
            sparsity,
            what=what,
            dtype=dtype,
            shape=shape,
            values=buffers[buffer_index],
            buffers=buffers,
            buf=buf,
            spend=r.spend,
            ints=r.ints,
        )
    elif buffer_index != 0:
        if -1 in shape:
            raise ModelFormatError(f"{what}: a constant tensor needs a static shape, got {shape}")
        offset, size = buffers[buffer_index]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        expected = count * dtype.itemsize
        if size != expected:
            raise ModelFormatError(
                f"{what}: buffer {buffer_index} holds {size} bytes but shape {shape} x "
                f"{dtype} needs {expected}"
            )
        if offset % dtype.itemsize:
            # A misaligned buffer is copied; many tensors sharing one must not multiply that.
            r.spend(size // 4 + 1, what)
            raw = bytes(memoryview(buf)[offset : offset + size])
            data = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
        else:
            data = np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)
        data.flags.writeable = False
    quant = None
    q = t.Quantization()
    if q is not None:
        scale = np.asarray(r.floats(q, 0, "Scale", 4, what + " scale"), dtype=np.float32)
        zero_point = np.asarray(r.ints(q, 1, "ZeroPoint", 8, what + " zero_point"), dtype=np.int64)
        qmin = r.floats(q, 3, "Min", 4, what + " min")
        qmax = r.floats(q, 4, "Max", 4, what + " max")
        quant = Quantization(
            scale=scale,
            zero_point=zero_point,
            axis=q.QuantizedDimension(),
            min=np.asarray(qmin, np.float32) if qmin else None,
            max=np.asarray(qmax, np.float32) if qmax else None,
        )
    dim_names = tuple(
        r.string(t.DimNames(j), what + " dim_names")
        for j in range(r.check_vector(t, 7, 4, what + " dim_names"))
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
        quantization=quant,
        sparsity=sparse.bitmask(shape) if sparsity is not None else None,
        trainable=bool(t.Trainable()),
        dim_names=dim_names,
    )


def _parse_attribute(r: _Reader, a: Any, what: str) -> tuple[str, Any]:
    name = r.string(a.Name(), what + " attribute name")
    kind = a.Kind()
    what = f"{what} attribute {name!r}"
    if kind == fb.AttrKind.INT:
        return name, int(a.I())
    if kind == fb.AttrKind.FLOAT:
        return name, float(a.F())
    if kind == fb.AttrKind.STRING:
        return name, r.string(a.S(), what)
    if kind == fb.AttrKind.INTS:
        return name, r.ints(a, 5, "Ints", 8, what)
    if kind == fb.AttrKind.FLOATS:
        return name, r.floats(a, 6, "Floats", 8, what)
    raise ModelFormatError(f"{what}: unknown attribute kind {kind}")


def _parse_node(r: _Reader, n: Any, where: str) -> Node:
    code = n.Op()
    try:
        op = OpCode(code)
    except ValueError:
        raise ModelFormatError(f"{where}: unknown op code {code}") from None
    what = f"{where} ({op.name})"
    r.spend(4, what)  # as for tensors: an honest node table is >= 16 bytes
    inputs = r.ints(n, 2, "Inputs", 4, what + " inputs")
    outputs = r.ints(n, 3, "Outputs", 4, what + " outputs")
    attrs: dict[str, Any] = {}
    for j in range(r.check_vector(n, 4, 4, what + " attributes")):
        key, value = _parse_attribute(r, n.Attributes(j), what)
        attrs[key] = value
    return Node(
        op=op,
        inputs=inputs,
        outputs=outputs,
        attrs=attrs,
        version=n.Version(),
        name=r.string(n.Name(), what + " name"),
    )


def _parse(buf: Any) -> Model:
    size = len(buf)
    if size < 8:
        raise ModelFormatError(f"file is {size} bytes; a model file is at least 8 bytes")
    ident = bytes(buf[4:8])
    if ident != FILE_IDENTIFIER:
        raise ModelFormatError(
            f"file identifier is {ident!r}, expected {FILE_IDENTIFIER!r} (not a .spore model)"
        )
    root = struct.unpack_from("<I", buf, 0)[0]
    if root + 4 > size:
        raise ModelFormatError(f"root table offset {root} lies outside the {size}-byte file")
    r = _Reader(buf)
    m = fb.Model.GetRootAs(buf, 0)
    version = m.SchemaVersion()
    if version > SCHEMA_VERSION or version == 0:
        raise ModelFormatError(
            f"schema version {version} is not supported; this runtime reads 1..{SCHEMA_VERSION}"
        )
    buffers: list[tuple[int, int]] = []
    for i in range(r.check_vector(m, 6, 4, "buffer table")):
        b = m.Buffers(i)
        offset, length = b.Offset(), b.Size()
        if offset + length > size:
            raise ModelFormatError(
                f"buffer {i}: bytes {offset}..{offset + length} lie outside the {size}-byte file"
            )
        buffers.append((offset, length))
    if buffers and buffers[0][1] != 0:
        raise ModelFormatError("buffer 0 must be the empty sentinel")
    if not buffers:
        buffers = [(0, 0)]
    tensors = [
        _parse_tensor(r, m.Tensors(i), i, buffers, buf)
        for i in range(r.check_vector(m, 5, 4, "tensor table"))
    ]
    graphs = []
    for gi in range(r.check_vector(m, 4, 4, "graph list")):
        g = m.Graphs(gi)
        gname = r.string(g.Name(), f"graph {gi} name")
        nodes = [
            _parse_node(r, g.Nodes(j), f"graph {gi} node {j}")
            for j in range(r.check_vector(g, 3, 4, f"graph {gi} nodes"))
        ]
        graphs.append(
            Graph(
                name=gname,
                inputs=r.ints(g, 1, "Inputs", 4, f"graph {gi} inputs"),
                outputs=r.ints(g, 2, "Outputs", 4, f"graph {gi} outputs"),
                nodes=nodes,
            )
        )
    signatures: dict[str, Signature] = {}
    for si in range(r.check_vector(m, 7, 4, "signatures")):
        s = m.Signatures(si)
        what = f"signature {si}"
        in_names = [
            r.string(s.InputNames(j), what)
            for j in range(r.check_vector(s, 2, 4, what + " input names"))
        ]
        out_names = [
            r.string(s.OutputNames(j), what)
            for j in range(r.check_vector(s, 4, 4, what + " output names"))
        ]
        in_tensors = r.ints(s, 3, "InputTensors", 4, what + " input tensors")
        out_tensors = r.ints(s, 5, "OutputTensors", 4, what + " output tensors")
        if len(in_names) != len(in_tensors) or len(out_names) != len(out_tensors):
            raise ModelFormatError(f"{what}: names and tensor lists differ in length")
        key = r.string(s.Key(), what + " key")
        signatures[key] = Signature(
            key=key,
            graph=s.Graph(),
            inputs=dict(zip(in_names, in_tensors, strict=True)),
            outputs=dict(zip(out_names, out_tensors, strict=True)),
        )
    metadata = {}
    for ki in range(r.check_vector(m, 8, 4, "metadata")):
        kv = m.Metadata(ki)
        metadata[r.string(kv.Key(), f"metadata {ki}")] = r.string(kv.Value(), f"metadata {ki}")
    return Model(
        tensors=tensors,
        graphs=graphs,
        signatures=signatures,
        metadata=metadata,
        producer=r.string(m.Producer(), "producer"),
        producer_version=r.string(m.ProducerVersion(), "producer_version"),
        description=r.string(m.Description(), "description"),
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
