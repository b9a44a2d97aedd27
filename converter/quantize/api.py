"""quantize_model: a float .spore model in, a smaller one out, with a per-tensor report."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.passes.activation_fusion import fuse_activations, unfuse_activations
from sporenet.converter.passes.batchnorm_folding import fold_batch_norms
from sporenet.converter.passes.dead_code import eliminate_dead_nodes
from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.converter.quantize.calibration import check_calibration, run_all
from sporenet.converter.quantize.observers import Method, MinMaxObserver, make_observer
from sporenet.converter.quantize.report import QuantizationReport, compare
from sporenet.converter.quantize.static import quantize_static
from sporenet.converter.quantize.weight_only import to_float16, to_int8_weights
from sporenet.lite.errors import LiteError
from sporenet.lite.format import parse, serialize
from sporenet.lite.graph import Model
from sporenet.lite.validate import validate

E = TypeVar("E", bound=StrEnum)


class Mode(StrEnum):
    """What gets quantized: activations and weights (int8, uint8) or weights only."""

    INT8 = "int8"
    UINT8 = "uint8"
    DYNAMIC = "dynamic"
    FP16 = "fp16"


STATIC_DTYPES = {Mode.INT8: np.dtype(np.int8), Mode.UINT8: np.dtype(np.uint8)}


@dataclass
class QuantizationResult:
    """The quantized model (its .spore bytes and IR) and the report."""

    data: bytes
    model: Model
    report: QuantizationReport


def _choice(enum: type[E], value: object, what: str) -> E:
    try:
        return enum(value)  # type: ignore[arg-type]
    except ValueError:
        raise ConversionError(
            f"{what} must be one of {[m.value for m in enum]}, got {value!r}"
        ) from None


def _load(model: bytes | bytearray | memoryview | Model) -> Model:
    if isinstance(model, Model):
        return copy.deepcopy(model)
    if isinstance(model, bytes | bytearray | memoryview):
        try:
            return parse(bytes(model))
        except LiteError as exc:
            raise ConversionError(f"cannot read the model to quantize: {exc}") from exc
    raise ConversionError(f"model must be .spore bytes or a lite Model, got {type(model).__name__}")


def _check_float(model: Model) -> None:
    for t in model.tensors:
        if t.quantization is not None or (t.data is not None and t.dtype == np.float16):
            raise ConversionError(
                f"the model is already quantized (tensor {t.name!r} is "
                f"{t.dtype}{' with quantization' if t.quantization else ''})"
            )
    if len(model.graphs) != 1:
        raise ConversionError(
            f"only single-graph models can be quantized; this one has "
            f"{len(model.graphs)} graphs (a training signature?)"
        )


def calibrate(
    model: Model, data: Mapping[str, np.ndarray], method: Method
) -> dict[str, tuple[float, float]]:
    """The range of every float activation over the calibration data, by tensor name."""
    observers: dict[str, MinMaxObserver] = {}
    for values in run_all(model, data):
        for name, value in values.items():
            if value.dtype.kind != "f":
                continue
            if name not in observers:
                observers[name] = make_observer(method)
            observers[name].update(value)
    for index in model.graphs[0].inputs:  # graph inputs are runs' feeds, not outputs
        name = model.tensors[index].name
        feed = next(
            (a for k, a in data.items() if model.signature("infer").inputs.get(k) == index), None
        )
        if feed is not None and feed.dtype.kind == "f":
            observer = make_observer(method)
            observer.update(feed)
            observers[name] = observer
    return {name: obs.range() for name, obs in observers.items() if obs.seen}


def quantize_model(
    model: bytes | Model,
    *,
    mode: str = "int8",
    calibration: Mapping[str, np.ndarray] | None = None,
    ranges: Mapping[str, tuple[float, float]] | None = None,
    per_channel: bool = True,
    method: str = "minmax",
    report: bool = True,
) -> QuantizationResult:
    """Quantize a float model after folding its BatchNorms (and fusing activations).

    mode "int8"/"uint8": static quantization; activation ranges come from `calibration`
    (input name -> samples on axis 0, calibrated with `method`), overridden per tensor
    name by `ranges` (e.g. ranges learned by quantization-aware training). Ops without an
    int8 kernel stay float between DEQUANTIZE and QUANTIZE and are listed in the report.
    mode "dynamic": int8 weights, float activations; "fp16": float16 weights.
    `report=False` skips the float-against-quantized comparison.
    """
    mode_ = _choice(Mode, mode, "mode")
    method_ = _choice(Method, method, "the calibration method")
    ir = _load(model)
    _check_float(ir)
    float_bytes = len(serialize(ir))
    fold_batch_norms(ir)
    fuse_activations(ir)  # a fused ReLU is a clamp of the int8 output, not a node of its own
    if mode_ in STATIC_DTYPES:
        unfuse_activations(ir)  # the others (Sigmoid, SiLU, ...) run as int8 lookup tables
    eliminate_dead_nodes(ir)
    compact_tensors(ir)
    reference = copy.deepcopy(ir)
    data = check_calibration(ir, calibration) if calibration is not None else None
    static = mode_ in STATIC_DTYPES
    if static and data is None and not ranges:
        raise ConversionError(
            f"--quantize {mode_} needs calibration data (one array of "
            "samples per model input) or ranges for its tensors"
        )
    result = QuantizationReport(
        mode=str(mode_),
        method=str(method_) if static else None,
        per_channel=per_channel,
        float_bytes=float_bytes,
    )
    if static:
        found = calibrate(ir, data, method_) if data is not None else {}
        found.update({k: (float(lo), float(hi)) for k, (lo, hi) in (ranges or {}).items()})
        result.float_ops = quantize_static(
            ir, found, dtype=STATIC_DTYPES[mode_], per_channel=per_channel
        )
    elif mode_ == Mode.DYNAMIC:
        to_int8_weights(ir, per_channel=per_channel)
    else:
        to_float16(ir)
    compact_tensors(ir)
    ir.metadata["quantization"] = str(mode_)
    try:
        validate(ir)
        out = serialize(ir)
    except LiteError as exc:
        raise ConversionError(f"the quantized graph is invalid: {exc}") from exc
    result.quantized_bytes = len(out)
    if report and data is not None:
        compare(reference, parse(out), data, result)
    return QuantizationResult(data=out, model=ir, report=result)
