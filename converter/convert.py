"""The converter's Python API: ONNX in, .spore bytes out (typed errors, never exits)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sporenet.converter.errors import ConversionError, InvalidOnnxError, UnsupportedOnnxOpError
from sporenet.converter.heap import trim_heap
from sporenet.converter.onnx_import.importer import import_onnx
from sporenet.converter.onnx_import.loader import (
    OnnxSource,
    TensorBytes,
    explain_invalid,
    load_onnx,
    release_pages,
)
from sporenet.converter.passes import Pass
from sporenet.converter.passes import optimize as run_passes
from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.lite.errors import LiteError
from sporenet.lite.format import serialize
from sporenet.lite.graph import DYNAMIC, Model, Node, shape_text
from sporenet.lite.ops import OpCode
from sporenet.lite.validate import validate


@dataclass
class ConversionReport:
    """What a conversion did: op counts before and after, parameters, passes, timings."""

    onnx_ops: Counter[str] = field(default_factory=Counter)
    ir_ops_before: Counter[str] = field(default_factory=Counter)
    ir_ops_after: Counter[str] = field(default_factory=Counter)
    parameters: int = 0
    passes: dict[str, int] = field(default_factory=dict)
    opset: int = 0
    producer: str = ""
    seconds: float = 0.0
    undone: dict[str, str] = field(default_factory=dict)  # pass -> why its result was invalid
    source_bytes: int = 0  # the model file, its external-data files included
    output_bytes: int = 0
    notes: list[str] = field(default_factory=list)  # what the user should know (a fixed size)


def _ir_ops(model: Model) -> Counter[str]:
    return Counter(node.op.name for g in model.graphs for node in g.nodes)


def parameter_count(model: Model) -> int:
    """The model's parameters, counted as sporenet-inspect counts them (Model.parameter_count:
    elements of the float tensors stored in the file), so both tools report one number."""
    return model.parameter_count()


def finish_conversion(
    ir: Model, report: ConversionReport, metadata: Mapping[str, str] | None, start: float
) -> None:
    """Store the caller's metadata in `ir` and fill the report's after-conversion figures.

    `start` is the time.perf_counter() value taken when the conversion began.
    """
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise ConversionError(
                f"metadata must map non-empty str keys to str values, got {key!r}: {value!r}"
            )
        ir.metadata[key] = value
    report.ir_ops_after = _ir_ops(ir)
    report.parameters = parameter_count(ir)
    report.seconds = time.perf_counter() - start


def _is_integer_node(ir: Model, node: Node) -> bool:
    """A node that runs an int8 kernel: its first input is a quantized int8/uint8 tensor."""
    if not node.inputs or node.inputs[0] == -1:
        return False
    t = ir.tensors[node.inputs[0]]
    return t.quantization is not None and t.dtype in (np.dtype(np.int8), np.dtype(np.uint8))


def mark_onnx_rounding(ir: Model) -> None:
    """A model quantized for onnxruntime: its QUANTIZE and integer nodes round as
    onnxruntime does (the `rounding` attribute, docs/quantization.md)."""
    for graph in ir.graphs:
        for node in graph.nodes:
            if node.op == OpCode.QUANTIZE or _is_integer_node(ir, node):
                node.attrs["rounding"] = "onnx"


def _fold_qdq(ir: Model) -> int:
    from sporenet.converter.passes.dead_code import eliminate_dead_nodes
    from sporenet.converter.passes.qdq_folding import fold_qdq

    folded = fold_qdq(ir)
    mark_onnx_rounding(ir)
    eliminate_dead_nodes(ir)
    compact_tensors(ir)
    return folded


def quantized_lowering(ir: Model) -> tuple[Pass, ...]:
    """For a quantized model, the passes that fold its QUANTIZE/DEQUANTIZE pairs into
    integer kernels (activations fused first, so a Conv -> Relu -> QuantizeLinear folds
    into one node); none for a float model."""
    if not any(n.op == OpCode.QUANTIZE for g in ir.graphs for n in g.nodes):
        return ()
    from sporenet.converter.passes.activation_fusion import fuse_activations

    return (Pass("qdq-activation-fusion", fuse_activations), Pass("qdq-folding", _fold_qdq))


def _dynamic_hint(ir: Model) -> str:
    """For a graph with dynamic inputs: which, and that --input-shape pins them."""
    graph = ir.graphs[0]
    dynamic = [ir.tensors[i] for i in graph.inputs if DYNAMIC in ir.tensors[i].shape]
    if not dynamic:
        return ""
    listed = ", ".join(f"{t.name} {shape_text(t)}" for t in dynamic)
    return (
        f" (the model has dynamic input dimensions: {listed}; give the sizes you run it at "
        "with --input-shape NAME:D0,D1,...)"
    )


def convert_onnx_model(
    model: OnnxSource,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    optimize: bool = True,
    metadata: Mapping[str, str] | None = None,
) -> tuple[Model, ConversionReport]:
    """Import (and optimize) an ONNX model; returns the IR Model and a report."""
    ir, report, _ = _convert_loaded(
        model, input_shapes=input_shapes, optimize=optimize, metadata=metadata
    )
    return ir, report


def _convert_loaded(
    model: OnnxSource,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None,
    optimize: bool,
    metadata: Mapping[str, str] | None,
) -> tuple[Model, ConversionReport, TensorBytes]:
    """convert_onnx_model, also returning the mapped bytes the IR's in-place tensors
    read (not the parsed message, freed before the output is built)."""
    start = time.perf_counter()
    loaded = load_onnx(model)
    proto = loaded.model
    report = ConversionReport(onnx_ops=Counter(n.op_type for n in proto.graph.node))
    report.producer = f"{proto.producer_name} {proto.producer_version}".strip()
    report.source_bytes = loaded.source_bytes
    try:
        ir = import_onnx(proto, input_shapes=input_shapes, data=loaded.data)
    except UnsupportedOnnxOpError:
        raise
    except ConversionError as exc:
        # The checker is not run up front (loader.py): asked now, it names invalid ONNX.
        reason = explain_invalid(model)
        if reason is not None:
            raise InvalidOnnxError(
                f"{loaded.where}: the ONNX checker rejects the model: {reason}"
            ) from exc
        raise
    report.opset = max(
        (o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0
    )
    compact_tensors(ir)
    mark_onnx_rounding(ir)
    report.ir_ops_before = _ir_ops(ir)
    try:
        if optimize:
            run = run_passes(ir, first=quantized_lowering(ir))
            report.passes, report.undone = run.rewrites, run.undone
        validate(ir)
    except LiteError as exc:
        raise ConversionError(f"the converted graph is invalid: {exc}{_dynamic_hint(ir)}") from exc
    ir.metadata.update({"source_format": "onnx", "source_opset": str(report.opset)})
    if proto.producer_name:
        ir.metadata["source_producer"] = report.producer
    finish_conversion(ir, report, metadata, start)
    loaded.release_pages()
    return ir, report, loaded.data


def convert_onnx(
    model: OnnxSource,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    optimize: bool = True,
    metadata: Mapping[str, str] | None = None,
    quantize: str | None = None,
    calibration: Mapping[str, np.ndarray] | None = None,
    per_channel: bool = True,
    calibration_method: str = "minmax",
) -> bytes:
    """Convert an ONNX model (a path, serialized bytes or an onnx.ModelProto) to .spore bytes.

    `input_shapes` fixes dynamic input dimensions ({"input": (1, 3, 224, 224)}),
    `optimize=False` skips the graph passes, `metadata` is stored in the file.
    `quantize` ("int8", "uint8", "dynamic", "fp16") quantizes the result with
    sporenet.converter.quantize.quantize_model (static modes need `calibration`: input
    name -> samples on axis 0).
    Raises InvalidOnnxError, UnsupportedOnnxOpError or ConversionError.
    """
    ir, _, mapped = _convert_loaded(
        model, input_shapes=input_shapes, optimize=optimize, metadata=metadata
    )
    if quantize is not None:
        from sporenet.converter.quantize import quantize_model

        return quantize_model(
            ir,
            mode=quantize,
            calibration=calibration,
            per_channel=per_channel,
            method=calibration_method,
            report=False,
        ).data
    trim_heap()  # the freed ONNX message and temporaries, before the output is built
    try:
        # The mapped source's pages are dropped as their tensors are copied out.
        return serialize(ir, release_pages=lambda: release_pages(mapped))
    except LiteError as exc:
        raise ConversionError(f"cannot write the converted model: {exc}") from exc
