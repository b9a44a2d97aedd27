"""A parsed .tflite model -> sporenet IR Model: inputs, constants, per-op handlers, outputs."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.tflite_import.layout import LayoutContext, identity, quantization
from sporenet.converter.tflite_import.ops import HANDLERS
from sporenet.converter.tflite_import.ops.common import Shared
from sporenet.converter.tflite_import.reader import (
    SUBGRAPH_FIELDS,
    TfliteModel,
    TfliteSubgraph,
)
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Model, Signature
from sporenet.lite.kernels import KERNELS, QUANTIZED_KERNELS


class UnsupportedTfliteOpError(ConversionError):
    """The model uses TFLite builtin ops the converter cannot import; all are listed."""

    def __init__(self, ops: Counter[str]) -> None:
        self.ops = dict(sorted(ops.items()))
        listed = ", ".join(f"{name} (x{count})" for name, count in self.ops.items())
        super().__init__(
            f"{len(self.ops)} unsupported TFLite op type(s) in {sum(ops.values())} "
            f"operator(s): {listed}. Supported: {', '.join(supported_tflite_ops())}."
        )


def supported_tflite_ops() -> list[str]:
    """TFLite op names the converter imports with this runtime (every IR op the handler
    emits has a kernel), sorted."""
    kernels = {*KERNELS, *QUANTIZED_KERNELS}
    return sorted(name for name, entry in HANDLERS.items() if set(entry.emits) <= kernels)


def reachable(model: TfliteModel) -> list[TfliteSubgraph]:
    """The main subgraph and those its CALL_ONCE, IF and WHILE operators run, in order."""
    seen, order = {0}, [0]
    for s in order:
        for op in model.subgraphs[s].operators:
            for field in SUBGRAPH_FIELDS.get(op.op, ()):
                target = int(getattr(op.options, field)())
                if target not in seen:
                    seen.add(target)
                    order.append(target)
    return [model.subgraphs[s] for s in order]


# Tensor types handled by their ops alone (VAR_HANDLE's resource handles).
_HANDLE_TYPES = ("RESOURCE",)


def _check(model: TfliteModel) -> None:
    """Refuse, all at once, the ops without a handler and the tensors the IR cannot hold."""
    graphs = reachable(model)
    supported = set(supported_tflite_ops())
    unsupported = Counter(op.op for g in graphs for op in g.operators if op.op not in supported)
    if unsupported:
        raise UnsupportedTfliteOpError(unsupported)
    bad: set[str] = set()
    sparse: set[str] = set()
    for g in graphs:
        used = {i for op in g.operators for i in (*op.inputs, *op.outputs) if i != -1}
        used.update(g.inputs)
        for i in used:
            t = g.tensors[i]
            # a handle may enter a subgraph its IF or WHILE passes it to, not the model
            main_input = g.index == 0 and i in g.inputs
            if t.dtype is None and (t.type_name not in _HANDLE_TYPES or main_input):
                bad.add(f"{t.name!r} ({t.type_name})")
            if t.sparse:
                sparse.add(t.name)
    if bad:
        raise ConversionError(f"tensors of types the IR cannot store: {', '.join(sorted(bad))}")
    if sparse:
        raise ConversionError(
            f"sparse TFLite tensors are not supported: {', '.join(sorted(sparse))}"
        )


InputShapes = Mapping[str, Sequence[int]]
"""Input name (the tensor's, or its name in a signature) -> the shape to convert it at."""


def import_tflite(
    model: TfliteModel,
    *,
    input_shapes: InputShapes | None = None,
    notes: list[str] | None = None,
    emitted: dict[str, set] | None = None,
) -> Model:
    """Translate the model's first subgraph (and the subgraphs it runs) into an IR Model.

    Inputs keep their dynamic dimensions (-1 in the file's shape signature), resized at run
    time as LiteRT's resize_tensor_input does, unless `input_shapes` fixes them. A graph
    that only runs at the sizes the file was saved with (a RESHAPE that hard-codes the
    batch) is converted at those sizes, as LiteRT runs it before any resize; `notes` then
    says so. `emitted`, when given, collects the IR ops each TFLite op type's nodes used.
    """
    _check(model)
    shapes = _input_shapes(model, input_shapes or {})
    if shapes or not any(DYNAMIC in model.tensors[i].signature for i in model.inputs):
        return _import(model, shapes, emitted)
    try:
        return _import(model, {}, emitted)
    except ConversionError as exc:
        failure = exc
    saved = {i: model.tensors[i].shape for i in model.inputs}
    try:
        ir = _import(model, saved, emitted)
    except ConversionError:
        hint = " ".join(
            f"{model.tensors[i].name}:{','.join('N' if d == DYNAMIC else str(d) for d in sig)}"
            for i in model.inputs
            if DYNAMIC in (sig := model.tensors[i].signature)
        )
        raise ConversionError(
            f"{failure}; the graph runs neither at the sizes the converter tries for its "
            f"dynamic dimensions nor at those the file was saved with: give the sizes you "
            f"run it at with --input-shape {hint} (each N replaced by a size)"
        ) from None
    if notes is not None:
        fixed = ", ".join(f"{model.tensors[i].name} {list(s)}" for i, s in saved.items())
        notes.append(
            f"converted at the input sizes the file was saved with ({fixed}): the graph does "
            f"not run at other sizes of its dynamic dimensions ({failure})"
        )
    return ir


def _input_shapes(model: TfliteModel, given: InputShapes) -> dict[int, tuple[int, ...]]:
    """Graph input index -> the shape `given` fixes it at, each checked against the file's
    shape signature (only its -1 dimensions may change)."""
    names = {model.tensors[i].name: i for i in model.inputs}
    for sig in model.signatures:
        if sig.subgraph == 0:
            names.update((n, i) for n, i in sig.inputs.items() if i in model.inputs)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConversionError(
            f"--input-shape names {unknown}, which are not model inputs; inputs are {sorted(names)}"
        )
    shapes: dict[int, tuple[int, ...]] = {}
    for name, dims in given.items():
        index = names[name]
        shape = tuple(int(d) for d in dims)
        declared = model.tensors[index].signature
        if len(shape) != len(declared) or any(
            d not in (DYNAMIC, s) or s < 0 for d, s in zip(declared, shape, strict=True)
        ):
            raise ConversionError(
                f"--input-shape {name}:{','.join(map(str, shape))} does not fit the input's "
                f"shape signature {list(declared)} (only its -1 dimensions may change)"
            )
        if index in shapes and shapes[index] != shape:
            raise ConversionError(f"--input-shape gives input {name!r} two different shapes")
        shapes[index] = shape
    return shapes


def _add_inputs(
    model: TfliteModel, lc: LayoutContext, declared: dict[int, tuple[int, ...]]
) -> None:
    """The graph's inputs, each of its declared shape (-1: dynamic)."""
    for i in model.inputs:
        t = model.tensors[i]
        if t.data is not None:
            raise ConversionError(f"graph input {t.name!r} has constant data")
        if t.dtype is None:
            raise ConversionError(f"graph input {t.name!r} has type {t.type_name}")
        ir = lc.ctx.graph_input(t.name, declared[i], t.dtype)
        lc.set_quantization(ir, quantization(t.quant, identity(len(t.shape))))
        lc.set(i, ir)


def _import(
    model: TfliteModel, shapes: dict[int, tuple[int, ...]], emitted: dict[str, set] | None
) -> Model:
    """Import subgraph 0 (and the subgraphs it runs); inputs in `shapes` are fixed at those
    shapes, the others keep their shape signature."""
    declared = {i: shapes.get(i, model.tensors[i].signature) for i in model.inputs}
    dynamic = any(DYNAMIC in s for s in declared.values())
    ctx = ImportContext(dynamic=dynamic, reserved=[model.tensors[i].name for i in model.inputs])
    lc = LayoutContext(model, ctx, model.main, Shared(emitted=emitted))
    _add_inputs(model, lc, declared)
    import_operators(lc)
    outputs: dict[str, int] = {}
    for i in model.outputs:
        if i not in lc.held:
            raise ConversionError(f"graph output {model.tensors[i].name!r} is not computed")
        index = lc.get(i)
        if index not in ctx.inputs:
            ctx.rename(index, model.tensors[i].name)
        outputs[ctx.tensors[index].name] = index
    built = ctx.build(outputs, producer="sporenet-convert (tflite)", description=model.description)
    signatures = _signatures(model, lc)
    if signatures:
        built.signatures = signatures
    return built


def import_operators(lc: LayoutContext) -> None:
    """Import the operators of `lc`'s subgraph, in order, into its ImportContext (whose
    graph inputs the caller has set)."""
    ctx, graph = lc.ctx, lc.graph
    for op in graph.operators:
        lc.op = op
        ctx.where = lc.where
        for i in op.inputs:
            if i == -1 or i in lc.held:
                continue
            t = graph.tensors[i]
            data = t.data
            if data is None and t.dtype is not None and 0 in t.shape:
                data = np.zeros(t.shape, t.dtype)  # an empty constant needs no buffer
            if data is None and t.is_variable:
                continue  # a recurrent op's state: its handler makes it an IR variable
            if data is None:
                raise lc.fail(
                    f"input {t.name!r} is neither a graph input, a constant nor "
                    "the output of an earlier operator"
                )
            ir = ctx.constant(t.name, data)
            lc.set_quantization(ir, quantization(t.quant, identity(len(t.shape))))
            lc.set(i, ir)
        before, ctx.emitted = len(ctx.nodes), set()
        try:
            HANDLERS[op.op].convert(lc, op)
        except ConversionError as exc:
            message = str(exc)
            raise ConversionError(
                message if message.startswith(lc.where) else f"{lc.where}: {message}"
            ) from None
        except (struct.error, AttributeError) as exc:
            # Options are read lazily from the file: out of its bounds, or a table of
            # another op's options (the reader checks indices and buffers, not these).
            raise ConversionError(
                f"{lc.where}: malformed operator options ({type(exc).__name__}: {exc})"
            ) from None
        except (ArithmeticError, LookupError, TypeError, ValueError, LiteError) as exc:
            raise ConversionError(
                f"{lc.where}: cannot convert: {type(exc).__name__}: {exc}"
            ) from exc
        if lc.shared is not None and lc.shared.emitted is not None:
            made = {n.op for n in ctx.nodes[before:]} | ctx.emitted  # folded ones too
            lc.shared.emitted.setdefault(op.op, set()).update(made)
        missing = [graph.tensors[o].name for o in op.outputs if o not in lc.held]
        if missing:
            raise lc.fail(f"outputs {missing} were not produced")
    lc.op = None


def _signatures(model: TfliteModel, lc: LayoutContext) -> dict[str, Signature]:
    """The file's SignatureDefs on subgraph 0 as IR signatures of graph 0, with their own
    input and output names. A signature must name every input of the graph (the runtime
    feeds them all) and only its outputs."""
    signatures = {}
    for sig in model.signatures:
        if sig.subgraph != 0:
            continue  # entry points into other subgraphs are not imported (yet)
        if sorted(sig.inputs.values()) != sorted(model.inputs) or not set(
            sig.outputs.values()
        ).issubset(model.outputs):
            raise ConversionError(
                f"signature {sig.key!r} maps inputs {sorted(sig.inputs)} and outputs "
                f"{sorted(sig.outputs)}, which are not the graph's inputs and outputs"
            )
        inputs = {name: lc.held[i][0] for name, i in sig.inputs.items()}
        outputs = {name: lc.get(i) for name, i in sig.outputs.items()}  # already in order
        signatures[sig.key] = Signature(key=sig.key, graph=0, inputs=inputs, outputs=outputs)
    return signatures
