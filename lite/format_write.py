"""Writing .spore files: the FlatBuffer header, then each constant's bytes 64-aligned."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np

from sporenet.lite import lowp, sparse, strings
from sporenet.lite.dtypes import STRING, to_ir_dtype
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.format_layout import ALIGNMENT, FILE_IDENTIFIER, SCHEMA_VERSION
from sporenet.lite.graph import Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.proto import model_generated as fb


def _align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def _attr_kind(name: str, value: Any) -> int:
    if isinstance(value, bool | int | np.integer):
        return fb.AttrKind.INT
    if isinstance(value, float | np.floating):
        return fb.AttrKind.FLOAT
    if isinstance(value, str):
        return fb.AttrKind.STRING
    if isinstance(value, list | tuple | np.ndarray):
        items = list(value)
        if all(isinstance(v, bool | int | np.integer) for v in items):
            return fb.AttrKind.INTS
        if all(isinstance(v, int | float | np.integer | np.floating) for v in items):
            return fb.AttrKind.FLOATS
    raise ModelFormatError(
        f"attribute {name!r} has unsupported value {value!r}; expected int, float, str, "
        "or a list of ints or floats"
    )


class _Writer:
    """Builds the FlatBuffer for a model whose buffer offsets are already decided."""

    def __init__(
        self,
        model: Model,
        buffer_ranges: list[tuple[int, int]],
        tensor_buffer: list[int],
        mask_buffer: dict[int, int] | None = None,
    ) -> None:
        self.model = model
        self.ranges = buffer_ranges
        self.tensor_buffer = tensor_buffer
        self.mask_buffer = mask_buffer or {}  # tensor index -> buffer of its BITMASK mask
        self.b = flatbuffers.Builder(1024)
        # Fixed field sizes, so two passes with different offsets give the same length.
        self.b.ForceDefaults(True)

    def _ints(self, start: Callable[[Any, int], int], values: list[int], width: str) -> int:
        b = self.b
        start(b, len(values))
        prepend = {
            "i": b.PrependInt32,
            "q": b.PrependInt64,
            "d": b.PrependFloat64,
            "f": b.PrependFloat32,
        }[width]
        for v in reversed(values):
            prepend(v)
        return b.EndVector()

    def _offsets(self, start: Callable[[Any, int], int], offsets: list[int]) -> int:
        start(self.b, len(offsets))
        for off in reversed(offsets):
            self.b.PrependUOffsetTRelative(off)
        return self.b.EndVector()

    def _string(self, s: str) -> int:
        return self.b.CreateString(s)

    def _strings(self, start: Callable[[Any, int], int], values: Sequence[str]) -> int:
        return self._offsets(start, [self._string(v) for v in values])

    def _tensor(self, t: Tensor, buffer_index: int, mask_index: int | None) -> int:
        b = self.b
        name = self._string(t.name)
        shape = self._ints(fb.TensorStartShapeVector, [int(d) for d in t.shape], "q")
        quant = self._quantization(t.quantization) if t.quantization is not None else None
        sparsity = self._sparsity(t.shape, mask_index) if mask_index is not None else None
        dim_names = (
            self._strings(fb.TensorStartDimNamesVector, t.dim_names) if t.dim_names else None
        )
        fb.TensorStart(b)
        fb.TensorAddName(b, name)
        fb.TensorAddDtype(b, to_ir_dtype(t.dtype))
        fb.TensorAddShape(b, shape)
        fb.TensorAddBuffer(b, buffer_index)
        if quant is not None:
            fb.TensorAddQuantization(b, quant)
        if sparsity is not None:
            fb.TensorAddSparsity(b, sparsity)
        fb.TensorAddTrainable(b, bool(t.trainable))
        if dim_names is not None:
            fb.TensorAddDimNames(b, dim_names)
        return fb.TensorEnd(b)

    def _quantization(self, q: Quantization) -> int:
        b = self.b
        scale = self._ints(
            fb.QuantizationParamsStartScaleVector, [float(x) for x in np.ravel(q.scale)], "f"
        )
        zp = self._ints(
            fb.QuantizationParamsStartZeroPointVector, [int(x) for x in np.ravel(q.zero_point)], "q"
        )
        qmin = (
            self._ints(
                fb.QuantizationParamsStartMinVector, [float(x) for x in np.ravel(q.min)], "f"
            )
            if q.min is not None
            else None
        )
        qmax = (
            self._ints(
                fb.QuantizationParamsStartMaxVector, [float(x) for x in np.ravel(q.max)], "f"
            )
            if q.max is not None
            else None
        )
        fb.QuantizationParamsStart(b)
        fb.QuantizationParamsAddScale(b, scale)
        fb.QuantizationParamsAddZeroPoint(b, zp)
        fb.QuantizationParamsAddQuantizedDimension(b, int(q.axis))
        if qmin is not None:
            fb.QuantizationParamsAddMin(b, qmin)
        if qmax is not None:
            fb.QuantizationParamsAddMax(b, qmax)
        return fb.QuantizationParamsEnd(b)

    def _sparsity(self, shape: tuple[int, ...], mask_index: int) -> int:
        b = self.b
        dense_shape = self._ints(
            fb.SparsityParamsStartDenseShapeVector, [int(d) for d in shape], "q"
        )
        fb.SparsityParamsStart(b)
        fb.SparsityParamsAddFormat(b, sparse.BITMASK)
        fb.SparsityParamsAddIndptrBuffer(b, 0)
        fb.SparsityParamsAddIndicesBuffer(b, mask_index)
        fb.SparsityParamsAddDenseShape(b, dense_shape)
        return fb.SparsityParamsEnd(b)

    def _attribute(self, name: str, value: Any) -> int:
        b = self.b
        kind = _attr_kind(name, value)
        name_off = self._string(name)
        s_off = self._string(value) if kind == fb.AttrKind.STRING else None
        ints_off = (
            self._ints(fb.AttributeStartIntsVector, [int(v) for v in value], "q")
            if kind == fb.AttrKind.INTS
            else None
        )
        floats_off = (
            self._ints(fb.AttributeStartFloatsVector, [float(v) for v in value], "d")
            if kind == fb.AttrKind.FLOATS
            else None
        )
        fb.AttributeStart(b)
        fb.AttributeAddName(b, name_off)
        fb.AttributeAddKind(b, kind)
        if kind == fb.AttrKind.INT:
            fb.AttributeAddI(b, int(value))
        elif kind == fb.AttrKind.FLOAT:
            fb.AttributeAddF(b, float(value))
        elif s_off is not None:
            fb.AttributeAddS(b, s_off)
        elif ints_off is not None:
            fb.AttributeAddInts(b, ints_off)
        elif floats_off is not None:
            fb.AttributeAddFloats(b, floats_off)
        return fb.AttributeEnd(b)

    def _node(self, n: Node) -> int:
        b = self.b
        attrs = [self._attribute(k, v) for k, v in n.attrs.items()]
        attrs_off = self._offsets(fb.NodeStartAttributesVector, attrs)
        ins = self._ints(fb.NodeStartInputsVector, list(n.inputs), "i")
        outs = self._ints(fb.NodeStartOutputsVector, list(n.outputs), "i")
        name = self._string(n.name)
        fb.NodeStart(b)
        fb.NodeAddOp(b, int(n.op))
        fb.NodeAddVersion(b, int(n.version))
        fb.NodeAddInputs(b, ins)
        fb.NodeAddOutputs(b, outs)
        fb.NodeAddAttributes(b, attrs_off)
        fb.NodeAddName(b, name)
        return fb.NodeEnd(b)

    def _graph(self, g: Graph) -> int:
        b = self.b
        nodes = self._offsets(fb.GraphStartNodesVector, [self._node(n) for n in g.nodes])
        ins = self._ints(fb.GraphStartInputsVector, list(g.inputs), "i")
        outs = self._ints(fb.GraphStartOutputsVector, list(g.outputs), "i")
        name = self._string(g.name)
        fb.GraphStart(b)
        fb.GraphAddName(b, name)
        fb.GraphAddInputs(b, ins)
        fb.GraphAddOutputs(b, outs)
        fb.GraphAddNodes(b, nodes)
        return fb.GraphEnd(b)

    def _signature(self, s: Signature) -> int:
        b = self.b
        in_names = self._offsets(
            fb.SignatureStartInputNamesVector, [self._string(k) for k in s.inputs]
        )
        out_names = self._offsets(
            fb.SignatureStartOutputNamesVector, [self._string(k) for k in s.outputs]
        )
        ins = self._ints(fb.SignatureStartInputTensorsVector, list(s.inputs.values()), "i")
        outs = self._ints(fb.SignatureStartOutputTensorsVector, list(s.outputs.values()), "i")
        key = self._string(s.key)
        fb.SignatureStart(b)
        fb.SignatureAddKey(b, key)
        fb.SignatureAddGraph(b, s.graph)
        fb.SignatureAddInputNames(b, in_names)
        fb.SignatureAddInputTensors(b, ins)
        fb.SignatureAddOutputNames(b, out_names)
        fb.SignatureAddOutputTensors(b, outs)
        return fb.SignatureEnd(b)

    def _key_value(self, key: str, value: str) -> int:
        b = self.b
        k, v = self._string(key), self._string(value)
        fb.KeyValueStart(b)
        fb.KeyValueAddKey(b, k)
        fb.KeyValueAddValue(b, v)
        return fb.KeyValueEnd(b)

    def _buffer(self, offset: int, size: int) -> int:
        fb.BufferStart(self.b)
        fb.BufferAddOffset(self.b, offset)
        fb.BufferAddSize(self.b, size)
        return fb.BufferEnd(self.b)

    def build(self) -> bytes:
        b, m = self.b, self.model
        tensors = [
            self._tensor(t, self.tensor_buffer[i], self.mask_buffer.get(i))
            for i, t in enumerate(m.tensors)
        ]
        tensors_off = self._offsets(fb.ModelStartTensorsVector, tensors)
        graphs_off = self._offsets(fb.ModelStartGraphsVector, [self._graph(g) for g in m.graphs])
        buffers_off = self._offsets(
            fb.ModelStartBuffersVector, [self._buffer(o, s) for o, s in self.ranges]
        )
        sigs_off = self._offsets(
            fb.ModelStartSignaturesVector, [self._signature(s) for s in m.signatures.values()]
        )
        meta_off = self._offsets(
            fb.ModelStartMetadataVector, [self._key_value(k, v) for k, v in m.metadata.items()]
        )
        producer = self._string(m.producer)
        producer_version = self._string(m.producer_version)
        description = self._string(m.description)
        fb.ModelStart(b)
        fb.ModelAddSchemaVersion(b, SCHEMA_VERSION)
        fb.ModelAddProducer(b, producer)
        fb.ModelAddProducerVersion(b, producer_version)
        fb.ModelAddDescription(b, description)
        fb.ModelAddGraphs(b, graphs_off)
        fb.ModelAddTensors(b, tensors_off)
        fb.ModelAddBuffers(b, buffers_off)
        fb.ModelAddSignatures(b, sigs_off)
        fb.ModelAddMetadata(b, meta_off)
        b.Finish(fb.ModelEnd(b), file_identifier=FILE_IDENTIFIER)
        return bytes(b.Output())


def _stored_sparse(t: Tensor, sparsify: bool) -> bool:
    """Whether the writer stores constant `t` in the BITMASK layout: when it is marked so
    (it was read sparse, or the caller asked), or with `sparsify` when that saves space."""
    if t.data is None or t.data.dtype == STRING or lowp.is_lowp(t.data.dtype):
        return False
    return t.sparsity is not None or (sparsify and sparse.worth_storing_sparse(t.data))


RELEASE_EVERY = 1 << 18
"""serialize calls its `release_pages` after each this many bytes of tensor data copied
(256 KiB: the resident part of a mapped source stays small; each call is one madvise)."""


def serialize(
    model: Model, *, sparsify: bool = False, release_pages: Callable[[], None] | None = None
) -> bytes:
    """The .spore bytes of `model` (validated first, so a bad model is never written).

    With `sparsify`, every constant tensor whose BITMASK layout (nonzero values plus one
    bit per element, see lite/sparse.py) saves at least a tenth of its bytes is stored so;
    tensors whose `sparsity` is set are stored sparse either way. `release_pages`, if
    given, is called every RELEASE_EVERY bytes copied: a converter whose tensors are views
    of a memory-mapped source drops the pages copied so far, so the mapping and the
    result are not both resident at the end.
    """
    from sporenet.lite.validate import validate

    validate(model)
    # One buffer per constant tensor (its values, if sparse, then its mask); buffer 0 is
    # the empty sentinel.
    blobs: list[np.ndarray] = []
    tensor_buffer: list[int] = []
    mask_buffer: dict[int, int] = {}
    for i, t in enumerate(model.tensors):
        if t.data is None:
            tensor_buffer.append(0)
        elif _stored_sparse(t, sparsify):
            values, mask = sparse.encode(t.data)
            blobs += [values, mask]
            tensor_buffer.append(len(blobs) - 1)
            mask_buffer[i] = len(blobs)
        elif t.data.dtype == STRING:
            blobs.append(strings.encode(t.data))
            tensor_buffer.append(len(blobs))
        elif lowp.is_lowp(t.data.dtype):
            blobs.append(lowp.pack(t.data))  # 4- and 2-bit elements packed as ONNX does
            tensor_buffer.append(len(blobs))
        else:
            blobs.append(np.ascontiguousarray(t.data))
            tensor_buffer.append(len(blobs))
    placeholder = [(0, 0)] * (len(blobs) + 1)
    head_size = len(_Writer(model, placeholder, tensor_buffer, mask_buffer).build())
    offset = _align(head_size)
    ranges: list[tuple[int, int]] = [(0, 0)]
    for blob in blobs:
        ranges.append((offset, blob.nbytes))
        offset = _align(offset + blob.nbytes)
    head = _Writer(model, ranges, tensor_buffer, mask_buffer).build()
    if len(head) != head_size:  # ForceDefaults makes both passes the same size
        raise RuntimeError("model header changed size between passes")
    # Every piece is written straight into the result: BytesIO sized once (its last byte
    # written first) returns its own buffer, so there is no whole-file copy beside it.
    out = io.BytesIO()
    out.seek((offset if blobs else len(head)) - 1)
    out.write(b"\0")
    out.seek(0)
    out.write(head)
    end, copied = len(head), 0
    for (start, size), blob in zip(ranges[1:], blobs, strict=True):
        out.write(bytes(start - end))
        out.write(memoryview(blob.reshape(-1).view(np.uint8)))
        end, copied = start + size, copied + size
        if release_pages is not None and copied >= RELEASE_EVERY:
            release_pages()
            copied = 0
    if blobs:
        out.write(bytes(offset - end))
    return out.getvalue()


def save(model: Model, path: str | os.PathLike, *, sparsify: bool = False) -> Path:
    """Write `model` to `path` atomically (temporary file, then rename); `sparsify` as for
    `serialize`."""
    path = Path(path)
    data = serialize(model, sparsify=sparsify)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
