"""ONNX ModelProto -> sporenet IR Model: initializers, inputs, per-op handlers, outputs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import onnx.version_converter
from onnx import helper

from sporenet.converter.errors import ConversionError, UnsupportedOnnxOpError
from sporenet.converter.onnx_import import lowp_compute
from sporenet.converter.onnx_import.context import ImportContext, contiguous
from sporenet.converter.onnx_import.functions import expand_functions
from sporenet.converter.onnx_import.in_place import TensorBytes, materialize, tensor_value
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.registry import HANDLERS, handler_available
from sporenet.lite import lowp
from sporenet.lite.dims import PROBE_FAMILIES, is_dynamic, may_feed_shapes, probe_shapes
from sporenet.lite.dtypes import NUMPY_TO_IR
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Model
from sporenet.lite.ops import OpCode

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()
DEFAULT_DOMAINS = ("", "ai.onnx")


EMITTED: dict[str, set[OpCode]] | None = None
"""While `recording_emitted_ops` runs: ONNX op type -> the IR ops its handler asked for."""


@contextmanager
def recording_emitted_ops() -> Iterator[dict[str, set[OpCode]]]:
    """Collect the IR ops each ONNX op type's handler emits (folded or not) while the
    block imports models: what a handler's `requires` must declare."""
    global EMITTED
    before, EMITTED = EMITTED, {}
    try:
        yield EMITTED
    finally:
        EMITTED = before


def op_key(node: onnx.NodeProto) -> str:
    """How an op type is named in errors and --list-ops (custom domains are prefixed)."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def _needs_upgrade(model: onnx.ModelProto) -> bool:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    return bool(versions) and max(versions) < MIN_OPSET


def upgrade_old_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Models older than opset 7 go through ONNX's version converter first (their
    broadcasting and attributes differ); newer ones are returned as they are."""
    if not _needs_upgrade(model):
        return model
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    try:
        return onnx.version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:  # the converter raises plain RuntimeError/ValueError subclasses
        raise ConversionError(
            f"opset {max(versions)} is older than the oldest supported ({MIN_OPSET}) and "
            f"ONNX's version converter cannot upgrade it: {str(exc).strip()[:200]}"
        ) from None


def onnx_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset the model was exported with, checked against our range."""
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        if any(node.domain in DEFAULT_DOMAINS for node in model.graph.node):
            raise ConversionError("the model imports no default-domain (ai.onnx) opset")
        # Only other domains' ops (an ai.onnx.ml model): the default opset is never read.
        return MAX_OPSET
    opset = max(versions)
    if opset < MIN_OPSET:
        raise ConversionError(
            f"opset {opset} is older than the oldest supported ({MIN_OPSET}); upgrade the model "
            "with onnx.version_converter.convert_version(model, 13)"
        )
    if opset > MAX_OPSET:
        raise ConversionError(f"opset {opset} is newer than the installed onnx knows ({MAX_OPSET})")
    return opset


def unsupported_ops(model: onnx.ModelProto) -> Counter[str]:
    """Count of every node op type in the model the converter cannot import."""
    missing: Counter[str] = Counter()
    pending = [model.graph]
    while pending:  # subgraphs (If branches, Loop bodies) included
        for node in pending.pop().node:
            key = op_key(node)
            if key not in HANDLERS or not handler_available(key):
                missing[key] += 1
            pending.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return missing


def _np_dtype(elem_type: int, what: str) -> np.dtype:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        dtype = None
    kind = lowp.TYPES.get(dtype.name) if dtype is not None else None
    if kind is not None:  # ml_dtypes' bfloat16, float8, int4, ...: the IR's own
        dtype = kind.dtype
    if dtype is None or dtype not in NUMPY_TO_IR:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        raise ConversionError(
            f"{what} has ONNX type {name}, which sporenet cannot store (supported: "
            f"{', '.join(sorted(str(d) for d in NUMPY_TO_IR))})"
        )
    return dtype


def initializer_value(tensor: onnx.TensorProto, data: TensorBytes | None = None) -> np.ndarray:
    """An initializer's value as a C-contiguous array (ConversionError if unreadable);
    `data`: the mapped bytes external tensors lie in (the model's own for tensors read in
    place, external-data files): the value is a view of them, no copy."""
    _np_dtype(tensor.data_type, f"initializer {tensor.name!r}")
    try:
        array = lowp.from_foreign(tensor_value(tensor, data))
    except (ValueError, TypeError) as exc:
        raise ConversionError(f"initializer {tensor.name!r} cannot be read: {exc}") from None
    return contiguous(array)


def _input_shape(value: onnx.ValueInfoProto, override: Sequence[int] | None) -> tuple[int, ...]:
    tt = value.type.tensor_type
    if override is not None:
        shape = tuple(int(d) for d in override)
        if tt.HasField("shape"):
            declared = [d.dim_value if d.HasField("dim_value") else DYNAMIC for d in tt.shape.dim]
            if len(declared) != len(shape) or any(
                d not in (DYNAMIC, s) for d, s in zip(declared, shape, strict=True)
            ):
                raise ConversionError(
                    f"--input-shape {value.name}:{','.join(map(str, shape))} does not fit the "
                    f"declared shape {declared} (-1: dynamic)"
                )
        if any(s < 0 for s in shape):
            raise ConversionError(f"input shape for {value.name!r} has a negative dimension")
        return shape
    if not tt.HasField("shape"):
        raise ConversionError(
            f"input {value.name!r} declares no shape; give one with --input-shape "
            f"{value.name}:D0,D1,..."
        )
    return tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC for d in tt.shape.dim)


def _dim_names(value: onnx.ValueInfoProto, shape: tuple[int, ...]) -> tuple[str, ...]:
    """ONNX dim_param names of the dynamic dimensions ("" for the others); () if none."""
    dims = value.type.tensor_type.shape.dim
    if len(dims) != len(shape):
        return ()
    names = tuple(
        d.dim_param if s == DYNAMIC and d.HasField("dim_param") else ""
        for d, s in zip(dims, shape, strict=True)
    )
    return names if any(names) else ()


def import_onnx(
    model: onnx.ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    data: TensorBytes | None = None,
) -> Model:
    """Translate an ONNX model into an IR Model (not yet optimized). `data`: the mapped
    bytes of its external tensors, from load_onnx (their values are views of them)."""
    if data and _needs_upgrade(model):
        materialize(model, data)  # the version converter reads tensors from the message
        data = None
    model = upgrade_old_opset(model)
    opset = onnx_opset(model)
    model = expand_functions(model, opset, handler_available)
    missing = unsupported_ops(model)
    if missing:
        raise UnsupportedOnnxOpError(missing)
    graph = model.graph
    shapes = dict(input_shapes or {})
    initializers = {t.name for t in graph.initializer}
    real_inputs = [v for v in graph.input if v.name not in initializers]
    unknown = sorted(set(shapes) - {v.name for v in real_inputs})
    if unknown:
        raise ConversionError(
            f"--input-shape names {unknown}, which are not model inputs; inputs are "
            f"{[v.name for v in real_inputs]}"
        )
    input_specs = []
    for v in real_inputs:
        if not v.type.HasField("tensor_type"):
            raise ConversionError(
                f"input {v.name!r} is not a tensor (sequences and maps are not supported)"
            )
        dtype = _np_dtype(v.type.tensor_type.elem_type, f"input {v.name!r}")
        shape = _input_shape(v, shapes.get(v.name))
        input_specs.append((v.name, shape, dtype, _dim_names(v, shape)))
    dims = [(shape, names) for _, shape, _, names in input_specs]
    if not is_dynamic(dims):
        return _import_graph(model, opset, input_specs, 0, data)
    # Dynamic dimensions: the graph is followed under two probe sizes of each, from the
    # first family of sizes under which every node accepts them (lite/dims.py).
    first: ConversionError | None = None
    for family in range(len(PROBE_FAMILIES)):
        try:
            return _import_graph(model, opset, input_specs, family, data)
        except ConversionError as exc:
            first = first or exc
    raise ConversionError(
        f"the model does not accept the sizes the converter tries for its dynamic input "
        f"dimensions ({_describe_inputs(input_specs)}); give the sizes you run it at with "
        f"--input-shape {_shape_hint(input_specs)} (each name replaced by a size). At the "
        f"first sizes tried: {first}"
    ) from None


InputSpec = tuple[str, tuple[int, ...], np.dtype, tuple[str, ...]]
"""A graph input: name, declared shape (-1: dynamic), dtype, dimension names."""


def _dim_text(shape: tuple[int, ...], names: tuple[str, ...]) -> list[str]:
    names = names or ("",) * len(shape)
    return [str(d) if d != DYNAMIC else (n or "?") for d, n in zip(shape, names, strict=True)]


def _describe_inputs(input_specs: Sequence[InputSpec]) -> str:
    return ", ".join(
        f"{name} [{', '.join(_dim_text(shape, names))}]"
        for name, shape, _, names in input_specs
        if DYNAMIC in shape
    )


def _shape_hint(input_specs: Sequence[InputSpec]) -> str:
    return " ".join(
        f"{name}:{','.join(_dim_text(shape, names)).replace('?', 'N')}"
        for name, shape, _, names in input_specs
        if DYNAMIC in shape
    )


def _import_graph(
    model: onnx.ModelProto,
    opset: int,
    input_specs: Sequence[InputSpec],
    family: int,
    data: TensorBytes | None,
) -> Model:
    """Import the main graph, dynamic dimensions followed under probe family `family`."""
    graph = model.graph
    dims = [(shape, names) for _, shape, _, names in input_specs]
    probes = list(zip(*(probe_shapes(dims, k, family) for k in (0, 1)), strict=True))
    initializers = {t.name for t in graph.initializer}
    reserved = {name for n in graph.node for name in n.output if name}
    reserved |= initializers | {name for name, _, _, _ in input_specs}
    ctx = ImportContext(dynamic=is_dynamic(dims), reserved=reserved)
    ctx.opset = opset
    ctx.data = data

    names = ctx.scope.names
    for t in graph.initializer:
        names[t.name] = ctx.constant(t.name, initializer_value(t, data))
    for (name, shape, dtype, dim_names), probe in zip(input_specs, probes, strict=True):
        names[name] = ctx.graph_input(name, shape, dtype, probe, dim_names)
        if may_feed_shapes(shape):
            ctx.fed.add(names[name])
    import_nodes(ctx, graph.node, graph_outputs={v.name for v in graph.output})

    outputs: dict[str, int] = {}
    for v in graph.output:
        if v.name not in names:
            raise ConversionError(f"graph output {v.name!r} is not produced by any node")
        outputs[v.name] = names[v.name]
    description = model.doc_string or graph.doc_string
    producer = f"sporenet-convert (from {model.producer_name or 'ONNX'}"
    producer += f" {model.producer_version})" if model.producer_version else ")"
    return ctx.build(outputs, producer=producer, description=description)


LARGE_ATTRIBUTE = 4096
"""Integer and float attribute lists of at least this many entries (a tree ensemble's
node tables, an SVM's support vectors) are read as int64 / float64 arrays: as Python
lists they would take four times the memory, and the file's varints far less."""


def attribute_value(attribute: onnx.AttributeProto) -> Any:
    """An attribute's value as onnx.helper gives it, but large INTS and FLOATS as arrays
    (LARGE_ATTRIBUTE; float64 holds the float32 entries exactly, as Python floats do)."""
    kind = onnx.AttributeProto
    if attribute.type == kind.INTS and len(attribute.ints) >= LARGE_ATTRIBUTE:
        return np.fromiter(attribute.ints, np.int64, len(attribute.ints))
    if attribute.type == kind.FLOATS and len(attribute.floats) >= LARGE_ATTRIBUTE:
        return np.fromiter(attribute.floats, np.float64, len(attribute.floats))
    return helper.get_attribute_value(attribute)


def _names_read(proto: onnx.NodeProto) -> set[str]:
    """The values a node reads: its inputs and every name its subgraphs read (those of the
    outer scopes among them; the subgraphs' own names are never read outside)."""
    names = {name for name in proto.input if name}
    for attribute in proto.attribute:
        graphs = [attribute.g] if attribute.HasField("g") else []
        for graph in [*graphs, *attribute.graphs]:
            for node in graph.node:
                names |= _names_read(node)
            names |= {v.name for v in graph.output}
    return names


def _release_read(
    ctx: ImportContext,
    proto: onnx.NodeProto,
    unread: Counter[str],
    graph_outputs: Collection[str],
    new: range,
) -> None:
    """After `proto` is imported: drop the folded values of the values it was the last
    to read and of its translation's own intermediate tensors (`new` less its outputs)."""
    done = [n for n in _names_read(proto) if n not in graph_outputs]
    unread.subtract(done)
    scope = ctx.scope.names
    finished = [scope[n] for n in done if not unread[n] and n in scope]
    outputs = {scope[n] for n in proto.output if n in scope}
    ctx.release_values([*finished, *(i for i in new if i not in outputs)])


def _node_inputs(ctx: ImportContext, proto: onnx.NodeProto) -> list[int]:
    """The tensors a node reads (-1: an absent optional input), once its names are checked:
    every input produced earlier, no output defined before."""
    scope = ctx.scope
    inputs = []
    for name in proto.input:
        if not name:
            inputs.append(-1)
            continue
        index = scope.lookup(name)
        if index is None:
            raise ctx.fail(f"input {name!r} is not produced by any earlier node")
        inputs.append(index)
    for name in proto.output:
        if name and name in scope.names:
            raise ctx.fail(
                f"output {name!r} is already defined (an input, initializer or earlier "
                "node's output): ONNX names every value once"
            )
    return inputs


def import_nodes(
    ctx: ImportContext,
    nodes: Sequence[onnx.NodeProto],
    *,
    graph_outputs: Collection[str] | None = None,
) -> None:
    """Import ONNX nodes in order into `ctx`, resolving names through `ctx.scope` (which
    reaches outer scopes from a subgraph).

    With `graph_outputs` (the main graph's; a subgraph shares its outer scopes' values),
    the values folded here only to fold their readers (a weight stored int8 and
    dequantized by a Cast and a Mul, which the runtime computes at load) are dropped once
    no later node reads them: the import never holds every such weight in float32."""
    scope, opset = ctx.scope, ctx.opset
    unread = Counter(n for proto in nodes for n in _names_read(proto))
    for position, proto in enumerate(nodes):
        label = proto.name or (proto.output[0] if proto.output else f"#{position}")
        ctx.where = f"node {label!r} ({proto.op_type})"
        inputs = _node_inputs(ctx, proto)
        node = OnnxNode(
            op_type=proto.op_type,
            name=label,
            inputs=inputs,
            outputs=list(proto.output),
            attrs={a.name: attribute_value(a) for a in proto.attribute},
            opset=opset,
        )
        first_new = len(ctx.tensors)
        handler = HANDLERS[op_key(proto)]
        ctx.emitted = set()
        # An input planned at run time (its shape follows a value fed then): the node is
        # planned then too, if its handler needs no more than the input's dtype and rank.
        opaque = next(
            (n for n, i in zip(proto.input, inputs, strict=True) if i in ctx.opaque), None
        )
        try:
            try:
                if lowp_compute.needs_widening(ctx, node):
                    results = lowp_compute.convert_widened(ctx, node, handler.convert)
                else:
                    results = handler.convert(ctx, node)
            except (ArithmeticError, LookupError, TypeError, ValueError, LiteError):
                if opaque is None:
                    raise
                raise ctx.fail(
                    f"input {opaque!r} has a shape that depends on the value of an input fed "
                    "at run time; such values are planned only through ops that need no more "
                    "than their dtype and rank (give them as initializers to convert the rest)"
                ) from None
        except ConversionError as exc:
            message = str(exc)
            raise ConversionError(
                message if message.startswith(("node ", ctx.where)) else f"{ctx.where}: {message}"
            ) from None
        except (ArithmeticError, LookupError, TypeError, ValueError, LiteError) as exc:
            # A malformed node the checks above missed (or a converter bug): still one typed
            # error that names the node, never a bare traceback from deep inside.
            raise ConversionError(
                f"{ctx.where}: cannot convert: {type(exc).__name__}: {exc}"
            ) from exc
        for k, name in enumerate(proto.output):
            if not name:
                continue
            if k >= len(results):
                continue  # an optional output the converter does not produce (checked on use)
            index = results[k]
            scope.names[name] = index
            if index >= first_new and index not in ctx.inputs:
                ctx.rename(index, name)
        if graph_outputs is not None:
            _release_read(ctx, proto, unread, graph_outputs, range(first_new, len(ctx.tensors)))
        if EMITTED is not None:
            EMITTED.setdefault(op_key(proto), set()).update(ctx.emitted)
