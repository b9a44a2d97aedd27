"""Reading a .tflite file (TFLite's FlatBuffers schema, bindings in
proto/tflite_schema_generated.py) into plain records: tensors with their data as NumPy
views of the file, operators with their builtin op names and decoded options.

Every offset and index is checked; a truncated or malformed file raises one
InvalidTfliteError naming what is wrong.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.tflite_import.sparse import SparseFormatError, densify, read_sparsity
from sporenet.proto import tflite_schema_generated as tfl


class InvalidTfliteError(ConversionError):
    """The input is not a readable .tflite model."""


IDENTIFIER = b"TFL3"

# TFLite TensorType -> NumPy dtype (the types this converter can represent).
DTYPES: dict[int, np.dtype] = {
    tfl.TensorType.FLOAT32: np.dtype(np.float32),
    tfl.TensorType.FLOAT16: np.dtype(np.float16),
    tfl.TensorType.FLOAT64: np.dtype(np.float64),
    tfl.TensorType.INT32: np.dtype(np.int32),
    tfl.TensorType.INT64: np.dtype(np.int64),
    tfl.TensorType.INT16: np.dtype(np.int16),
    tfl.TensorType.INT8: np.dtype(np.int8),
    tfl.TensorType.UINT8: np.dtype(np.uint8),
    tfl.TensorType.BOOL: np.dtype(np.bool_),
    tfl.TensorType.COMPLEX64: np.dtype(np.complex64),
}
TYPE_NAMES = {v: k for k, v in vars(tfl.TensorType).items() if not k.startswith("_")}
BUILTIN_NAMES: dict[int, str] = {
    v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")
}
OPTION_CLASSES: dict[int, type] = {
    v: getattr(tfl, k)
    for k, v in vars(tfl.BuiltinOptions).items()
    if not k.startswith("_") and k != "NONE" and hasattr(tfl, k)
}


@dataclass
class Quant:
    """Affine quantization of a tensor: real = scale * (q - zero_point), per `axis` slice."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int


@dataclass
class TfliteTensor:
    name: str
    shape: tuple[int, ...]
    signature: tuple[int, ...]  # -1 for dimensions that vary (shape_signature)
    dtype: np.dtype | None  # None: a TFLite type the IR cannot hold (type_name says which)
    type_name: str
    data: np.ndarray | None  # constant value, a read-only view of the file
    quant: Quant | None
    is_variable: bool
    sparse: bool = False  # in TFLite's sparse format without data (nothing to expand)


@dataclass
class TfliteOperator:
    op: str  # builtin op name ("CONV_2D"), or "CUSTOM:<code>"
    inputs: list[int]  # -1: absent optional input
    outputs: list[int]
    options: Any = None  # the decoded builtin options table, or None
    index: int = 0
    custom_options: bytes | None = None  # a custom op's options, as the file stores them


@dataclass
class TfliteSubgraph:
    """One subgraph: its own tensor table, operators in execution order, inputs, outputs."""

    name: str
    tensors: list[TfliteTensor]
    operators: list[TfliteOperator]
    inputs: list[int]
    outputs: list[int]
    index: int = 0


@dataclass
class TfliteSignature:
    """A SignatureDef: a named entry point into a subgraph, with its own input and output
    names (LiteRT's `serving_default {img -> output_0}`) mapped to tensor indices."""

    key: str
    subgraph: int
    inputs: dict[str, int]
    outputs: dict[str, int]


@dataclass
class TfliteModel:
    version: int
    description: str
    subgraphs: list[TfliteSubgraph]
    signatures: list[TfliteSignature] = field(default_factory=list)

    # The first subgraph is the model; control flow and CALL_ONCE name the others.
    @property
    def main(self) -> TfliteSubgraph:
        return self.subgraphs[0]

    @property
    def tensors(self) -> list[TfliteTensor]:
        return self.subgraphs[0].tensors

    @property
    def operators(self) -> list[TfliteOperator]:
        return self.subgraphs[0].operators

    @property
    def inputs(self) -> list[int]:
        return self.subgraphs[0].inputs

    @property
    def outputs(self) -> list[int]:
        return self.subgraphs[0].outputs

    @property
    def num_subgraphs(self) -> int:
        return len(self.subgraphs)


def is_tflite(data: bytes | bytearray | memoryview) -> bool:
    """Whether the bytes carry TFLite's file identifier."""
    return len(data) >= 8 and bytes(data[4:8]) == IDENTIFIER


def read_tflite(data: bytes) -> TfliteModel:
    """Parse and check a .tflite file's bytes (the first subgraph is the model)."""
    if not is_tflite(data):
        found = bytes(data[4:8]) if len(data) >= 8 else f"{len(data)} bytes"
        raise InvalidTfliteError(
            f"not a .tflite model: expected the file identifier {IDENTIFIER!r} at bytes 4-8, "
            f"found {found!r}"
        )
    try:
        return _read(data)
    except InvalidTfliteError:
        raise
    except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidTfliteError(f"malformed .tflite file: {type(exc).__name__}: {exc}") from None


MAX_CUSTOM_OPTIONS = 1 << 20
"""Largest custom-options blob read (1 MiB): MediaPipe's are a few dozen bytes."""


def _read(data: bytes) -> TfliteModel:
    model = tfl.Model.GetRootAs(data, 0)
    count = model.SubgraphsLength()
    if count < 1:
        raise InvalidTfliteError("the .tflite model has no subgraph")
    buffers = [_buffer(data, model, i) for i in range(model.BuffersLength())]
    codes = [_op_name(model.OperatorCodes(i)) for i in range(model.OperatorCodesLength())]
    subgraphs = [
        _subgraph(data, model.Subgraphs(s), s, count, buffers, codes) for s in range(count)
    ]
    description = model.Description()
    return TfliteModel(
        version=model.Version(),
        description=description.decode("utf-8", "replace") if description else "",
        subgraphs=subgraphs,
        signatures=_signatures(model),
    )


# Options naming other subgraphs, checked against the model's subgraph count.
SUBGRAPH_FIELDS = {
    "CALL_ONCE": ("InitSubgraphIndex",),
    "IF": ("ThenSubgraphIndex", "ElseSubgraphIndex"),
    "WHILE": ("CondSubgraphIndex", "BodySubgraphIndex"),
}


def _subgraph(
    data: bytes,
    graph: Any,
    s: int,
    count: int,
    buffers: list[np.ndarray | None],
    codes: list[str],
) -> TfliteSubgraph:
    where = f"subgraph {s}"
    tensors = [_tensor(graph.Tensors(i), buffers, i) for i in range(graph.TensorsLength())]
    n = len(tensors)

    def indices(values: Any, what: str, *, optional: bool = False) -> list[int]:
        out = [int(v) for v in (values if not isinstance(values, int) else [])]
        for v in out:
            if not (0 <= v < n or (optional and v == -1)):
                raise InvalidTfliteError(f"{where}: {what} refers to tensor {v}; it has {n}")
        return out

    operators = []
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        code = op.OpcodeIndex()
        if not 0 <= code < len(codes):
            raise InvalidTfliteError(
                f"{where}: operator {k} has opcode index {code}; the model has "
                f"{len(codes)} operator codes"
            )
        name = codes[code]
        options = None
        table = op.BuiltinOptions()
        cls = OPTION_CLASSES.get(op.BuiltinOptionsType())
        if table is not None and cls is not None:
            options = cls()
            options.Init(table.Bytes, table.Pos)
        for field_name in SUBGRAPH_FIELDS.get(name, ()):
            target = getattr(options, field_name)() if hasattr(options, field_name) else -1
            if not 0 < target < count:
                raise InvalidTfliteError(
                    f"{where}: operator {k} ({name}) has {field_name} {target}; the "
                    f"model's other subgraphs are 1..{count - 1}"
                )
        operators.append(
            TfliteOperator(
                op=name,
                inputs=indices(op.InputsAsNumpy(), f"operator {k} ({name})", optional=True),
                outputs=indices(op.OutputsAsNumpy(), f"operator {k} ({name})"),
                options=options,
                index=k,
                custom_options=_custom_options(data, op, f"{where}: operator {k} ({name})"),
            )
        )
    label = graph.Name()
    return TfliteSubgraph(
        name=label.decode("utf-8", "replace") if label else f"subgraph_{s}",
        tensors=tensors,
        operators=operators,
        inputs=indices(graph.InputsAsNumpy(), "the graph's inputs"),
        outputs=indices(graph.OutputsAsNumpy(), "the graph's outputs"),
        index=s,
    )


def _custom_options(data: bytes, op: Any, where: str) -> bytes | None:
    """A custom op's options: inline, or past the FlatBuffer (large models)."""
    offset, size = int(op.LargeCustomOptionsOffset()), int(op.LargeCustomOptionsSize())
    if offset > 1:
        if size > MAX_CUSTOM_OPTIONS or offset + size > len(data):
            raise InvalidTfliteError(
                f"{where}: custom options span bytes {offset}..{offset + size} of the "
                f"{len(data)}-byte file (at most {MAX_CUSTOM_OPTIONS} bytes are read)"
            )
        return bytes(data[offset : offset + size])
    if op.CustomOptionsLength() == 0:
        return None
    if op.CustomOptionsLength() > MAX_CUSTOM_OPTIONS:
        raise InvalidTfliteError(
            f"{where}: {op.CustomOptionsLength()} bytes of custom options, more than "
            f"{MAX_CUSTOM_OPTIONS}"
        )
    return op.CustomOptionsAsNumpy().tobytes()


def _signatures(model: Any) -> list[TfliteSignature]:
    """The file's SignatureDefs, tensor indices checked against their subgraph's tensors."""
    signatures = []
    keys: set[str] = set()
    for k in range(model.SignatureDefsLength()):
        sig = model.SignatureDefs(k)
        key = (sig.SignatureKey() or b"").decode("utf-8", "replace")
        subgraph = int(sig.SubgraphIndex())
        if not key or key in keys:
            raise InvalidTfliteError(f"signature {k} has an empty or repeated key {key!r}")
        if not 0 <= subgraph < model.SubgraphsLength():
            raise InvalidTfliteError(
                f"signature {key!r} refers to subgraph {subgraph}; "
                f"the model has {model.SubgraphsLength()}"
            )
        n = model.Subgraphs(subgraph).TensorsLength()
        signatures.append(
            TfliteSignature(
                key=key,
                subgraph=subgraph,
                inputs=_tensor_map(key, n, sig.InputsLength(), sig.Inputs, "input"),
                outputs=_tensor_map(key, n, sig.OutputsLength(), sig.Outputs, "output"),
            )
        )
        keys.add(key)
    return signatures


def _tensor_map(key: str, n: int, count: int, item: Any, what: str) -> dict[str, int]:
    """A signature's inputs or outputs: name -> tensor index (of a subgraph of n tensors)."""
    names: dict[str, int] = {}
    for j in range(count):
        entry = item(j)
        name = (entry.Name() or b"").decode("utf-8", "replace")
        index = int(entry.TensorIndex())
        if not name or name in names or not 0 <= index < n:
            raise InvalidTfliteError(
                f"signature {key!r}: {what} {j} ({name!r} -> tensor {index}) has an empty or "
                f"repeated name or a tensor outside the subgraph's {n}"
            )
        names[name] = index
    return names


def _op_name(code: Any) -> str:
    # Builtin codes above 127 live in builtin_code; older files only fill the deprecated byte.
    builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
    name = BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}")
    if name == "CUSTOM":
        custom = code.CustomCode()
        return f"CUSTOM:{custom.decode('utf-8', 'replace') if custom else '?'}"
    return name


def _buffer(data: bytes, model: Any, index: int) -> np.ndarray | None:
    buffer = model.Buffers(index)
    offset, size = int(buffer.Offset()), int(buffer.Size())
    if offset > 1:  # data stored after the FlatBuffer (models over 2 GB)
        if offset + size > len(data):
            raise InvalidTfliteError(
                f"buffer {index} spans bytes {offset}..{offset + size}, "
                f"past the end of the {len(data)}-byte file"
            )
        return np.frombuffer(data, np.uint8, size, offset)
    if buffer.DataLength() == 0:
        return None
    return buffer.DataAsNumpy()


def _tensor(t: Any, buffers: list[np.ndarray | None], index: int) -> TfliteTensor:
    name = (t.Name() or b"").decode("utf-8", "replace") or f"tensor_{index}"
    type_code = t.Type()
    type_name = TYPE_NAMES.get(type_code, str(type_code))
    dtype = DTYPES.get(type_code)
    shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    signature = (
        tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
    )
    if len(signature) != len(shape) or any(d < 0 for d in shape):
        raise InvalidTfliteError(
            f"tensor {name!r}: shape {list(shape)} with signature {list(signature)}"
        )
    buffer = t.Buffer()
    if not 0 <= buffer < max(len(buffers), 1):
        raise InvalidTfliteError(
            f"tensor {name!r} refers to buffer {buffer}; the model has {len(buffers)}"
        )
    raw = buffers[buffer] if buffers else None
    data = None
    sparse = t.Sparsity() is not None
    if raw is not None and dtype is not None and sparse:
        if raw.size % dtype.itemsize:
            raise InvalidTfliteError(
                f"tensor {name!r}: {raw.size} bytes of sparse values are not whole {dtype} values"
            )
        try:
            data = densify(raw.view(dtype), shape, read_sparsity(t.Sparsity()))
        except SparseFormatError as exc:
            raise InvalidTfliteError(f"tensor {name!r}: {exc}") from None
        data.flags.writeable = False
        sparse = False  # expanded: a constant like any other
    elif raw is not None and dtype is not None:
        count = int(np.prod(shape, dtype=np.int64))
        if raw.size != count * dtype.itemsize:
            raise InvalidTfliteError(
                f"tensor {name!r}: buffer {buffer} holds {raw.size} bytes, "
                f"{dtype}{list(shape)} needs {count * dtype.itemsize}"
            )
        data = raw.view(dtype).reshape(shape) if raw.size else np.zeros(shape, dtype)
        data.flags.writeable = False
    quant = None
    q = t.Quantization()
    if q is not None and q.ScaleLength() > 0:
        scale = q.ScaleAsNumpy().astype(np.float32)
        zero = (
            q.ZeroPointAsNumpy().astype(np.int64)
            if q.ZeroPointLength()
            else np.zeros(scale.shape, np.int64)
        )
        quant = Quant(scale, zero, int(q.QuantizedDimension()))
    return TfliteTensor(
        name=name,
        shape=shape,
        signature=signature,
        dtype=dtype,
        type_name=type_name,
        data=data,
        quant=quant,
        is_variable=bool(t.IsVariable()),
        sparse=sparse,
    )
