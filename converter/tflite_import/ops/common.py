"""What the TFLite op handlers share: the handler type, fused activations, axis orders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet.converter.tflite_import.layout import LayoutContext, Perm, identity
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.graph import Quantization
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import Activation
from sporenet.proto import tflite_schema_generated as tfl

Handler = Callable[[LayoutContext, TfliteOperator], None]


@dataclass
class Shared:
    """What the imports of one model's subgraphs share (LayoutContext.shared)."""

    # VAR_HANDLE outputs, (subgraph, TFLite tensor) -> the variable's key
    handles: dict[tuple[int, int], str] = field(default_factory=dict)
    # variable key -> the IR tensor holding its value (a constant ASSIGN writes)
    variables: dict[str, int] = field(default_factory=dict)
    # variable key -> the value CALL_ONCE's init subgraph assigns, as stored
    initial: dict[str, tuple[np.ndarray, Quantization | None]] = field(default_factory=dict)
    initializing: bool = False  # importing an init subgraph: its assignments are initial values
    called: set[int] = field(default_factory=set)  # init subgraphs already run
    depth: int = 0  # subgraph imports in progress (bounded: a hostile file may nest them)
    detached: int = 0  # IR subgraphs (IF branches, LOOP bodies) being imported
    # per detached subgraph being imported, the variables threaded through it: key -> the
    # IR tensor holding the variable's current value there
    threads: list[dict[str, int]] = field(default_factory=list)
    # TFLite op type -> the IR ops its nodes used (filled when a caller asks, for tests)
    emitted: dict[str, set[OpCode]] | None = None


# TFLite ActivationFunctionType -> the IR's fused `activation` attributes.
FUSED: dict[int, dict[str, Any]] = {
    tfl.ActivationFunctionType.NONE: {},
    tfl.ActivationFunctionType.RELU: {"activation": Activation.RELU},
    tfl.ActivationFunctionType.RELU6: {"activation": Activation.RELU6},
    tfl.ActivationFunctionType.TANH: {"activation": Activation.TANH},
    tfl.ActivationFunctionType.RELU_N1_TO_1: {
        "activation": Activation.CLIP,
        "clip_min": -1.0,
        "clip_max": 1.0,
    },
}


def fused(lc: LayoutContext, options: Any) -> dict[str, Any]:
    code = options.FusedActivationFunction() if options is not None else 0
    if code not in FUSED:
        raise lc.fail(f"fused activation {code} (SIGN_BIT) is not supported")
    return FUSED[code]


def apply_fused(lc: LayoutContext, ir: int, options: Any) -> int:
    """A separate activation node for float ops whose kernels take no fused activation
    (int8 kernels clamp their output instead: see fused_attrs)."""
    if lc.quantized_ir(ir):
        return ir
    attrs = fused(lc, options)
    name = attrs.get("activation")
    if name is None:
        return ir
    if name == "clip":
        return lc.emit(OpCode.CLIP, [ir], min=-1.0, max=1.0)
    return lc.emit({"relu": OpCode.RELU, "relu6": OpCode.RELU6, "tanh": OpCode.TANH}[name], [ir])


def fused_attrs(lc: LayoutContext, out: int, options: Any) -> dict[str, Any]:
    """The fused activation as an attribute, for int8 nodes (a clamp of their output)."""
    return fused(lc, options) if lc.quantized(out) else {}


def order_of(lc: LayoutContext, inputs: list[int], rank: int) -> Perm:
    """The axis order a broadcasting op runs in: that of its first full-rank non-constant
    input (so no transpose is needed for it), else TFLite's."""
    for i in inputs:
        if i != -1 and i in lc.held and lc.rank(i) == rank and lc.tensor(i).data is None:
            return lc.perm(i)
    return identity(rank)
