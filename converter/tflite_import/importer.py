"""A parsed .tflite model -> sporenet IR Model: inputs, constants, per-op handlers, outputs."""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.tflite_import.layout import LayoutContext, identity, quantization
from sporenet.converter.tflite_import.ops import HANDLERS
from sporenet.converter.tflite_import.ops.common import Shared
from sporenet.converter.tflite_import.reader import SUBGRAPH_FIELDS, TfliteModel, TfliteSubgraph
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Model
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
            if t.dtype is None and (t.type_name not in _HANDLE_TYPES or i in g.inputs):
                bad.add(f"{t.name!r} ({t.type_name})")
            if t.sparse:
                sparse.add(t.name)
    if bad:
        raise ConversionError(f"tensors of types the IR cannot store: {', '.join(sorted(bad))}")
    if sparse:
        raise ConversionError(
            f"sparse TFLite tensors are not supported: {', '.join(sorted(sparse))}"
        )


def import_tflite(model: TfliteModel, *, emitted: dict[str, set] | None = None) -> Model:
    """Translate the model's first subgraph (and the subgraphs it runs) into an IR Model.
    `emitted`, when given, collects the IR ops each TFLite op type's nodes used."""
    _check(model)
    dynamic = any(DYNAMIC in model.tensors[i].signature for i in model.inputs)
    ctx = ImportContext(dynamic=dynamic, reserved=[model.tensors[i].name for i in model.inputs])
    lc = LayoutContext(model, ctx, model.main, Shared(emitted=emitted))
    for i in model.inputs:
        t = model.tensors[i]
        if t.data is not None:
            raise ConversionError(f"graph input {t.name!r} has constant data")
        if t.dtype is None:
            raise ConversionError(f"graph input {t.name!r} has type {t.type_name}")
        ir = ctx.graph_input(t.name, t.signature, t.dtype)
        lc.set_quantization(ir, quantization(t.quant, identity(len(t.shape))))
        lc.set(i, ir)
    import_operators(lc)
    outputs: dict[str, int] = {}
    for i in model.outputs:
        if i not in lc.held:
            raise ConversionError(f"graph output {model.tensors[i].name!r} is not computed")
        index = lc.get(i)
        if index not in ctx.inputs:
            ctx.rename(index, model.tensors[i].name)
        outputs[ctx.tensors[index].name] = index
    return ctx.build(outputs, producer="sporenet-convert (tflite)", description=model.description)


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
        before = len(ctx.nodes)
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
            lc.shared.emitted.setdefault(op.op, set()).update(n.op for n in ctx.nodes[before:])
        missing = [graph.tensors[o].name for o in op.outputs if o not in lc.held]
        if missing:
            raise lc.fail(f"outputs {missing} were not produced")
    lc.op = None
