"""The per-tensor error report: float model against quantized model on the calibration data.

For every tensor the two models share by name: SQNR (dB) and the largest absolute error
of the quantized value (dequantized) against the float one, as TFLite's quantization
debugger and onnxruntime's QDQ loss debugging show them; plus the ops left in float.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from sporenet.converter.quantize import params as P
from sporenet.converter.quantize.calibration import batches, probe_model
from sporenet.converter.quantize.static import FloatOp
from sporenet.lite.graph import Model
from sporenet.lite.interpreter import Interpreter

REPORT_SAMPLES = 256
"""Calibration samples the report compares on (the first ones)."""


@dataclass
class TensorError:
    """Error of one tensor of the quantized model against the float model."""

    name: str
    op: str
    dtype: str
    sqnr_db: float
    max_abs_error: float
    float_range: tuple[float, float]
    output: str = ""  # the model's output name ("logits") when this tensor is one


@dataclass
class QuantizationReport:
    """What a quantization did and how far each tensor moved from float."""

    mode: str
    method: str | None
    per_channel: bool
    samples: int = 0
    tensors: list[TensorError] = field(default_factory=list)
    outputs: list[TensorError] = field(default_factory=list)
    float_ops: list[FloatOp] = field(default_factory=list)
    float_bytes: int = 0
    quantized_bytes: int = 0

    def worst(self, n: int = 5) -> list[TensorError]:
        """The `n` tensors with the lowest SQNR."""
        return sorted(self.tensors, key=lambda t: t.sqnr_db)[:n]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["worst"] = [t.name for t in self.worst()]
        return {k: _finite(v) for k, v in data.items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self, n: int = 5) -> str:
        ratio = self.quantized_bytes / max(self.float_bytes, 1)
        lines = [
            f"  quantized  : {self.mode}"
            + (f", {self.method} calibration on {self.samples} samples" if self.method else "")
            + (
                ""
                if self.mode == "fp16"
                else ", per-channel weights"
                if self.per_channel
                else ", per-tensor weights"
            ),
            f"  file       : {self.float_bytes:,} -> {self.quantized_bytes:,} bytes "
            f"({ratio:.2f}x float)",
        ]
        for t in self.outputs:
            shown = t.name if not t.output or t.output == t.name else f"{t.output} ({t.name})"
            lines.append(
                f"  output     : {shown}: SQNR {t.sqnr_db:.1f} dB, max abs error "
                f"{t.max_abs_error:.4g}"
            )
        if self.tensors:
            lines.append(
                "  worst      : "
                + "; ".join(f"{t.name} ({t.op}) {t.sqnr_db:.1f} dB" for t in self.worst(n))
            )
        if self.float_ops:
            lines.append(
                f"  kept float : {len(self.float_ops)} op(s): "
                + ", ".join(f"{f.node} ({f.op}: {f.reason})" for f in self.float_ops)
            )
        return "\n".join(lines)


def _finite(value: object) -> object:
    """JSON has no infinity: +-inf SQNR (exact or all-zero tensors) becomes a string."""
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _as_float(model: Model, name: str, index: int, value: np.ndarray) -> np.ndarray:
    q = model.tensors[index].quantization
    if value.dtype.kind in "iu" and q is not None:
        return P.dequantize(value, q)
    return value.astype(np.float32, copy=False)


def compare(
    reference: Model, quantized: Model, data: Mapping[str, np.ndarray], report: QuantizationReport
) -> None:
    """Fill `report.tensors` and `report.outputs` from runs of both models on `data`."""
    ref_ops = {
        reference.tensors[i].name: n.op.name for n in reference.graphs[0].nodes for i in n.outputs
    }
    q_index = {quantized.tensors[i].name: i for n in quantized.graphs[0].nodes for i in n.outputs}
    shared = [
        name
        for name in ref_ops
        if name in q_index and reference.tensors[reference.tensor_index(name)].dtype.kind == "f"
    ]
    ref_run = Interpreter(model=probe_model(reference, shared))
    q_run = Interpreter(model=probe_model(quantized, shared))
    outputs = {
        reference.tensors[i].name: key for key, i in reference.signature("infer").outputs.items()
    }
    stats: dict[str, list[float]] = {name: [0.0, 0.0, 0.0, np.inf, -np.inf] for name in shared}
    samples = 0
    for feeds in batches(reference, data, REPORT_SAMPLES):
        want = ref_run.run(feeds)
        got = q_run.run(feeds)
        samples += next(iter(feeds.values())).shape[0]
        for name in shared:
            f = want[name].astype(np.float64)
            q = _as_float(quantized, name, q_index[name], got[name]).astype(np.float64)
            s = stats[name]
            s[0] += float(np.sum(f * f))
            s[1] += float(np.sum((f - q) ** 2))
            s[2] = max(s[2], float(np.max(np.abs(f - q), initial=0.0)))
            s[3] = min(s[3], float(f.min(initial=np.inf)))
            s[4] = max(s[4], float(f.max(initial=-np.inf)))
    report.samples = samples
    for name in shared:
        signal, noise, max_err, lo, hi = stats[name]
        sqnr = (
            float("inf")
            if noise == 0
            else (float("-inf") if signal == 0 else 10 * np.log10(signal / noise))
        )
        entry = TensorError(
            name,
            ref_ops[name],
            str(quantized.tensors[q_index[name]].dtype),
            round(sqnr, 3),
            max_err,
            (lo, hi),
            outputs.get(name, ""),
        )
        report.tensors.append(entry)
        if name in outputs:
            report.outputs.append(entry)
