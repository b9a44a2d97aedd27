"""The converter's Python API for TFLite models: .tflite in, .spore bytes out."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping

from sporenet.converter.convert import ConversionReport, _ir_ops, finish_conversion
from sporenet.converter.errors import ConversionError
from sporenet.converter.passes import optimize as run_passes
from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.converter.tflite_import.importer import InputShapes, import_tflite
from sporenet.converter.tflite_import.reader import InvalidTfliteError, read_tflite
from sporenet.lite.errors import LiteError
from sporenet.lite.format import serialize
from sporenet.lite.graph import Model

TfliteSource = str | os.PathLike | bytes | bytearray | memoryview


def _load(model: TfliteSource) -> bytes:
    if isinstance(model, bytes | bytearray | memoryview):
        return bytes(model)
    try:
        with open(model, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidTfliteError(f"cannot read {model}: {exc.strerror or exc}") from None


def convert_tflite_model(
    model: TfliteSource,
    *,
    input_shapes: InputShapes | None = None,
    optimize: bool = True,
    metadata: Mapping[str, str] | None = None,
) -> tuple[Model, ConversionReport]:
    """Import (and optimize) a .tflite model; returns the IR Model and a report.

    `input_shapes` fixes inputs' dynamic dimensions ({"img": (1, 224, 224, 3)}, by tensor
    or signature input name); without it they stay dynamic."""
    start = time.perf_counter()
    parsed = read_tflite(_load(model))
    report = ConversionReport(onnx_ops=Counter(op.op for op in parsed.operators))
    report.producer = f"TFLite schema version {parsed.version}"
    ir = import_tflite(parsed, input_shapes=input_shapes, notes=report.notes)
    compact_tensors(ir)
    report.ir_ops_before = _ir_ops(ir)
    try:
        if optimize:
            run = run_passes(ir)
            report.passes, report.undone = run.rewrites, run.undone
        from sporenet.lite.validate import validate

        validate(ir)
    except LiteError as exc:
        raise ConversionError(f"the converted graph is invalid: {exc}") from exc
    ir.metadata.update({"source_format": "tflite", "source_version": str(parsed.version)})
    finish_conversion(ir, report, metadata, start)
    return ir, report


def convert_tflite(
    model: TfliteSource,
    *,
    input_shapes: InputShapes | None = None,
    optimize: bool = True,
    metadata: Mapping[str, str] | None = None,
) -> bytes:
    """Convert a .tflite model (a path or its bytes) to .spore bytes.

    Raises InvalidTfliteError, UnsupportedTfliteOpError (naming every unsupported builtin
    op) or ConversionError.
    """
    ir, _ = convert_tflite_model(
        model, input_shapes=input_shapes, optimize=optimize, metadata=metadata
    )
    try:
        return serialize(ir)
    except LiteError as exc:
        raise ConversionError(f"cannot write the converted model: {exc}") from exc
