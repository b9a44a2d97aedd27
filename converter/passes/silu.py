"""SiLU recognition: x * Sigmoid(x), as exporters write SiLU/Swish (PyTorch's nn.SiLU before
opset 24, YOLO-style detectors, TFLite's LOGISTIC + MUL), becomes one SILU node, which then
fuses into a preceding Conv/FullyConnected/Add like any activation.

SILU computes x / (1 + exp(-x)) in one step: the four passes of Sigmoid without the fifth
pass and the node of the product.
"""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import fuse_self_gated
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode


def fuse_silu(model: Model) -> int:
    """Rewrite every float x * Sigmoid(x) (either operand order) as SILU(x) when the
    Sigmoid's output has no other reader and is not a graph output; returns the count."""
    return fuse_self_gated(
        model,
        OpCode.SIGMOID,
        OpCode.SILU,
        lambda gate, x: model.tensors[x].dtype.kind == "f",
    )
