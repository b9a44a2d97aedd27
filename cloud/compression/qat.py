"""Quantization-aware training: fake-quant nodes in the training graph, int8 export.

`prepare_qat` turns a trained float Sequential into one that trains through the int8
rounding: BatchNorms are first folded into the convolutions before them (the int8 model
has no BatchNorm either, so training sees the weights it will ship), every Conv2d and
Dense reads its weight through a symmetric per-channel FAKE_QUANT (the grid the
converter gives int8 weights) and a `FakeQuant` layer with a learned [min, max] follows
the input rescaling, every activation and the logits. The ranges start at the min/max
of the float activations over calibration samples and are then learned by the
straight-through gradient (lite/autodiff/rules/fake_quant.py), in eager and graph mode
alike. `export_int8` strips the fake-quant nodes from the exported IR, keeps their
ranges by tensor name and hands both to the converter's quantizer, so the int8 file
uses the ranges training saw.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sporenet.cloud._checks import positive_int
from sporenet.cloud.errors import ConfigError, ExportError
from sporenet.cloud.export import to_inference_ir
from sporenet.cloud.layers import (
    GELU,
    BatchNorm2d,
    Conv2d,
    Dense,
    HardSwish,
    LeakyReLU,
    ReLU,
    ReLU6,
    Rescale,
    Sigmoid,
    Tanh,
)
from sporenet.cloud.module import Module, Parameter, Sequential, run_eager
from sporenet.cloud.tape import Var
from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_set

ACTIVATIONS = (ReLU, ReLU6, LeakyReLU, Sigmoid, Tanh, HardSwish, GELU)
SAME_RANGE_OPS = derived_set(lambda d: d.quant.keeps_params or d.op == OpCode.DROPOUT)
"""Ops whose int8 output shares its input's parameters (values are moved, not computed;
Dropout is the identity once exported)."""


class FakeQuant(Module):
    """Fake-quantizes activations to `num_bits` over a learned range [min, max].

    While `observing` (see `calibrate_ranges`) it passes values through unchanged and
    widens its range to cover them instead.
    """

    def __init__(self, *, num_bits: int = 8) -> None:
        super().__init__()
        self.num_bits = positive_int("num_bits", num_bits)
        self.min = Parameter(np.zeros(1, np.float32))
        self.max = Parameter(np.ones(1, np.float32))
        self.observing = False
        self.seen = False

    def forward(self, x: Var) -> Var:
        t = x.tape
        if self.observing:
            value = x.numpy()
            lo, hi = float(value.min(initial=0.0)), float(value.max(initial=0.0))
            if self.seen:
                lo, hi = min(lo, float(self.min.value[0])), max(hi, float(self.max.value[0]))
            self.min.value[0], self.max.value[0] = lo, hi
            self.seen = True
            return x
        return t.op(
            OpCode.FAKE_QUANT, [x, t.param(self.min), t.param(self.max)], num_bits=self.num_bits
        )

    def extra_repr(self) -> str:
        return f"[{float(self.min.value[0]):.4g}, {float(self.max.value[0]):.4g}]"


class WeightFakeQuant(Module):
    """A Conv2d or Dense whose weight passes through symmetric per-output-channel
    FAKE_QUANT (range [-max|w|, max|w|] per channel, int8 values in [-127, 127])."""

    def __init__(self, layer: Conv2d | Dense, *, num_bits: int = 8) -> None:
        super().__init__()
        if not isinstance(layer, Conv2d | Dense):
            raise ConfigError(f"WeightFakeQuant wraps a Conv2d or Dense, got {type(layer)}")
        self.layer = layer
        self.num_bits = positive_int("num_bits", num_bits)

    def forward(self, x: Var) -> Var:
        t, layer = x.tape, self.layer
        weight = t.op(
            OpCode.FAKE_QUANT,
            [t.param(layer.weight)],
            num_bits=self.num_bits,
            narrow_range=1,
            axis=0,
        )
        inputs = [x, weight]
        if layer.bias is not None:
            inputs.append(t.param(layer.bias))
        if isinstance(layer, Conv2d):
            return t.op(OpCode.CONV2D, inputs, **layer.attrs())
        return t.op(OpCode.FULLY_CONNECTED, inputs)

    def extra_repr(self) -> str:
        return repr(self.layer)


def _flat(model: Module) -> list[Module]:
    """The layers of a (nested) Sequential in order."""
    if not isinstance(model, Sequential):
        raise ConfigError(
            f"quantization-aware training takes a Sequential of layers, got {type(model).__name__}"
        )
    layers: list[Module] = []
    for layer in model:
        layers += _flat(layer) if isinstance(layer, Sequential) else [layer]
    return layers


def fold_batch_norms(model: Module) -> Sequential:
    """A copy of a Sequential in which each BatchNorm2d right after a Conv2d is folded into
    that convolution (its running statistics scale the weights and shift the bias)."""
    layers = [copy.deepcopy(layer) for layer in _flat(model)]
    out: list[Module] = []
    for layer in layers:
        prev = out[-1] if out else None
        if isinstance(layer, BatchNorm2d) and isinstance(prev, Conv2d):
            scale = layer.weight.value.astype(np.float64) / np.sqrt(
                layer.running_var.value.astype(np.float64) + layer.eps
            )
            bias = prev.bias.value.astype(np.float64) if prev.bias is not None else 0.0
            shift = (bias - layer.running_mean.value) * scale + layer.bias.value
            prev.weight.value = (prev.weight.value * scale[:, None, None, None]).astype(np.float32)
            prev.bias = Parameter(shift.astype(np.float32))
            continue
        out.append(layer)
    folded = Sequential(*out)
    folded.input_shape = getattr(model, "input_shape", None)
    return folded


def prepare_qat(
    model: Module, calibration: np.ndarray, *, num_bits: int = 8, batch_size: int = 256
) -> Sequential:
    """A quantization-aware copy of a trained float Sequential (the original is untouched).

    Args:
        model: a trained Sequential (nested Sequentials are flattened).
        calibration: input samples (N, ...) whose float activations set the initial ranges.
        num_bits: bits of the simulated integers (8 for int8).
        batch_size: samples per eager calibration batch.
    Returns:
        The QAT model: fine-tune it with `cloud.fit`, then `export_int8` it.
    Raises:
        ConfigError: the model is not a Sequential, or calibration is empty.
    """
    calibration = np.asarray(calibration, np.float32)
    if calibration.ndim < 2 or len(calibration) == 0:
        raise ConfigError(f"`calibration` must be samples (N, ...), got {calibration.shape}")
    layers = _flat(fold_batch_norms(model))
    out: list[Module] = []
    for k, layer in enumerate(layers):
        following = layers[k + 1] if k + 1 < len(layers) else None
        if isinstance(layer, Conv2d | Dense):
            out.append(WeightFakeQuant(layer, num_bits=num_bits))
            if not isinstance(following, ACTIVATIONS):
                out.append(FakeQuant(num_bits=num_bits))
        elif isinstance(layer, (*ACTIVATIONS, Rescale)):
            out += [layer, FakeQuant(num_bits=num_bits)]
        else:
            out.append(layer)
    qat = Sequential(*out)
    qat.input_shape = getattr(model, "input_shape", tuple(calibration.shape[1:]))
    calibrate_ranges(qat, calibration, batch_size=batch_size)
    return qat


def calibrate_ranges(model: Module, x: np.ndarray, *, batch_size: int = 256) -> None:
    """Set every FakeQuant's range to the min/max of its float input over `x` (eval mode)."""
    quants = [m for _, m in model.named_modules() if isinstance(m, FakeQuant)]
    for q in quants:
        q.observing, q.seen = True, False
    flags = {id(m): m.training for _, m in model.named_modules()}
    model.eval()
    try:
        for i in range(0, len(x), batch_size):
            run_eager(model, x[i : i + batch_size])
    finally:
        for q in quants:
            q.observing = False
        for _, m in model.named_modules():
            object.__setattr__(m, "training", flags[id(m)])


def strip_fake_quant(ir: Model) -> dict[str, tuple[float, float]]:
    """Remove the FAKE_QUANT nodes of an exported IR in place; returns the activation
    ranges they held, keyed by the name of the tensor each one quantized (and of the
    outputs of pooling and reshaping ops that read it, which int8 kernels give the same
    parameters)."""
    graph = ir.graphs[0]
    ranges: dict[str, tuple[float, float]] = {}
    alias: dict[int, int] = {}
    kept = []
    for node in graph.nodes:
        node.inputs = [alias.get(i, i) for i in node.inputs]
        if node.op != OpCode.FAKE_QUANT:
            kept.append(node)
            continue
        source = node.inputs[0]
        if len(node.inputs) >= 3:
            lo, hi = (ir.tensors[i].data for i in node.inputs[1:3])
            if lo is None or hi is None or lo.size != 1:
                raise ExportError(f"FAKE_QUANT {node.name!r}: ranges must be per-tensor constants")
            ranges[ir.tensors[source].name] = (float(lo.reshape(())), float(hi.reshape(())))
        alias[node.outputs[0]] = source
    graph.nodes = kept
    for node in kept:  # a range reaches the outputs of ops that only move values
        read = ir.tensors[node.inputs[0]].name if node.inputs else ""
        if node.op in SAME_RANGE_OPS and read in ranges:
            for i in node.outputs:
                ranges.setdefault(ir.tensors[i].name, ranges[read])
    graph.outputs = [alias.get(i, i) for i in graph.outputs]
    for sig in ir.signatures.values():
        sig.outputs = {k: alias.get(i, i) for k, i in sig.outputs.items()}
    compact_tensors(ir)
    return ranges


def export_int8(
    model: Module,
    calibration: np.ndarray,
    *,
    input_shape: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    mode: str = "int8",
    **options: Any,
) -> Any:
    """The int8 .spore of a QAT model, through the converter's quantizer.

    Args:
        model: a model from `prepare_qat`, fine-tuned.
        calibration: input samples; the converter calibrates the tensors QAT has no
            range for (e.g. the input of the graph) with them.
        input_shape, labels: as for `cloud.export`.
        mode: "int8" or "uint8".
        options: passed on to `quantize_model` (per_channel, method, report).
    Returns:
        The converter's QuantizationResult: `.data` the .spore bytes, `.report`.
    Raises:
        ExportError: the model cannot be traced or quantized.
    """
    from sporenet.converter.errors import ConversionError
    from sporenet.converter.quantize import quantize_model

    ir = to_inference_ir(model, input_shape=input_shape, labels=labels)
    ranges = strip_fake_quant(ir)
    try:
        return quantize_model(
            ir,
            mode=mode,
            ranges=ranges,
            calibration={"input": np.asarray(calibration, np.float32)},
            **options,
        )
    except ConversionError as exc:
        raise ExportError(f"could not quantize the model: {exc}") from exc


def range_of(model: Module) -> Mapping[str, tuple[float, float]]:
    """The current [min, max] of every FakeQuant layer, by module path (for inspection)."""
    return {
        path: (float(m.min.value[0]), float(m.max.value[0]))
        for path, m in model.named_modules()
        if isinstance(m, FakeQuant)
    }
