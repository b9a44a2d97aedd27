"""RNN, GRU and LSTM onto the runtime's sequence kernels (lite/kernels/recurrent.py).

The kernels take ONNX's inputs, gate layouts and attributes as they are, so a node maps
onto one IR node; the sequence length stays the input's. Activation names are checked here
and their alpha/beta resolved to one value per activation (ONNX lists them only for the
activations that take them).
"""

from __future__ import annotations

from typing import Any

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.kernels.recurrent import (
    ACTIVATIONS,
    DEFAULT_ACTIVATIONS,
    DIRECTIONS,
    NUM_INPUTS,
)
from sporenet.lite.ops import OpCode

OPS = {"LSTM": OpCode.LSTM, "GRU": OpCode.GRU, "RNN": OpCode.RNN}
# ONNX's activation names are case-insensitive in onnxruntime; the kernel uses these.
_NAMES = {name.lower(): name for name in ACTIVATIONS}


def _activations(node: OnnxNode, dirs: int) -> dict[str, Any]:
    names = node.attr("activations")
    if not names:
        return {}
    unknown = [n for n in names if n.lower() not in _NAMES]
    if unknown:
        raise node.fail(
            f"activations {unknown} are not supported (supported: {sorted(ACTIVATIONS)})"
        )
    names = [_NAMES[n.lower()] for n in names]
    per_dir = len(DEFAULT_ACTIVATIONS[node.op_type])
    if len(names) == per_dir and dirs == 2:
        names = names * 2  # onnxruntime reuses one direction's list for both
    alphas = list(node.attr("activation_alpha") or [])
    betas = list(node.attr("activation_beta") or [])
    alpha, beta = [], []
    for n in names:
        default = ACTIVATIONS[n]
        takes_alpha = default.alpha != 0.0 or n == "LeakyRelu"
        takes_beta = default.beta != 0.0 or n == "Affine"
        alpha.append(alphas.pop(0) if takes_alpha and alphas else default.alpha)
        beta.append(betas.pop(0) if takes_beta and betas else default.beta)
    return {"activations": ",".join(names), "activation_alpha": alpha, "activation_beta": beta}


def recurrent(
    ctx: ImportContext, node: OnnxNode, *, quantize_activations: bool = False
) -> list[int]:
    """One RNN, GRU or LSTM node; `quantize_activations` (LSTM) rounds X and the states
    to uint8 before each product, as com.microsoft DynamicQuantizeLSTM does."""
    kind = node.op_type
    direction = node.attr("direction", "forward")
    if direction not in DIRECTIONS:
        raise node.fail(f"direction must be one of {sorted(DIRECTIONS)}, got {direction!r}")
    attrs: dict[str, Any] = {
        "hidden_size": int(node.attr("hidden_size", 0)),
        "direction": direction,
        "layout": int(node.attr("layout", 0)),
        **_activations(node, len(DIRECTIONS[direction])),
    }
    if node.attr("clip") is not None:
        attrs["clip"] = float(node.attr("clip"))
    if kind == "GRU":
        attrs["linear_before_reset"] = int(node.attr("linear_before_reset", 0))
    if kind == "LSTM":
        attrs["input_forget"] = int(node.attr("input_forget", 0))
        if quantize_activations:
            attrs["quantize_activations"] = 1
    inputs = [node.input(k) for k in range(NUM_INPUTS[kind])]
    while inputs[-1] == -1:
        inputs.pop()
    return ctx.emit(OPS[kind], inputs, num_outputs=3 if kind == "LSTM" else 2, **attrs)
