"""Bias forwarding: a depthwise Conv2D's bias moved into the 1x1 Conv2D that reads it.

A depthwise layer without an activation whose only reader is an unpadded 1x1 convolution
(MobileNet and BlazeFace blocks: depthwise, then pointwise) need not add its bias: for
y = W2 (D(x) + b1) + b2 the 1x1 layer can add W2 b1 + b2 instead. The depthwise kernel
then skips a pass over its output (its multiply-adds run at element rate, so that pass
is a visible share of its time), while the 1x1 layer, which has a bias already, adds the
combined one at no extra cost.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import add_constant, consumers, producers
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode


def forward_depthwise_biases(model: Model) -> int:
    """Move every eligible depthwise bias into the 1x1 Conv2D after it (see the module
    docstring); returns the count."""
    moved = 0
    for graph in model.graphs:
        uses, made = consumers(graph), producers(graph)
        outputs = set(graph.outputs)
        for dw in graph.nodes:
            y = dw.outputs[0] if dw.outputs else -1
            readers = uses.get(y, [])
            if not _depthwise(model, dw) or y in outputs or len(readers) != 1:
                continue
            pw = readers[0]
            if not _pointwise(model, pw, y):
                continue
            b1 = _constant(model, made, dw.inputs[2])
            w2, b2 = _constant(model, made, pw.inputs[1]), _constant(model, made, pw.inputs[2])
            if (
                b1 is None
                or w2 is None
                or b2 is None
                or w2.shape[1:] != (b1.size, 1, 1)
                or b2.shape != (w2.shape[0],)
            ):
                continue
            combined = (b2 + w2[:, :, 0, 0] @ b1).astype(model.tensors[pw.inputs[2]].dtype)
            name = model.tensors[pw.inputs[2]].name
            pw.inputs = [*pw.inputs[:2], add_constant(model, name, combined)]
            dw.inputs = dw.inputs[:2]
            moved += 1
    return moved


def _constant(model: Model, made: dict[int, Node], index: int) -> np.ndarray | None:
    """The float64 value of a float constant tensor, or of a Cast of one (float16
    weights are stored so), else None."""
    if index == -1:
        return None
    tensor = model.tensors[index]
    if tensor.data is None:
        cast = made.get(index)
        if cast is None or cast.op != OpCode.CAST or len(cast.inputs) != 1:
            return None
        tensor = model.tensors[cast.inputs[0]]
    if tensor.data is None or tensor.dtype.kind != "f" or tensor.quantization is not None:
        return None
    return np.asarray(tensor.data, np.float64)


def _depthwise(model: Model, node: Node) -> bool:
    """A float depthwise Conv2D (one input channel per group) with a bias and no fused
    activation."""
    if node.op != OpCode.CONV2D or len(node.inputs) != 3 or -1 in node.inputs:
        return False
    if node.attrs.get("activation", "none") != "none":
        return False
    w, b = model.tensors[node.inputs[1]], model.tensors[node.inputs[2]]
    return (
        w.dtype.kind == "f"
        and w.quantization is None
        and len(w.shape) == 4
        and w.shape[1] == 1
        and node.attrs.get("group", 1) == w.shape[0] > 1
        and tuple(b.shape) == (w.shape[0],)
    )


def _pointwise(model: Model, node: Node, x: int) -> bool:
    """A float ungrouped 1x1 Conv2D without padding that reads `x` as its data input
    only, with a bias."""
    if node.op != OpCode.CONV2D or len(node.inputs) != 3 or node.inputs[0] != x:
        return False
    if x in node.inputs[1:] or node.attrs.get("group", 1) != 1:
        return False
    pads = node.attrs.get("pads")
    if isinstance(pads, list | tuple) and any(int(p) != 0 for p in pads):
        return False
    w = model.tensors[node.inputs[1]]
    return w.dtype.kind == "f" and w.quantization is None and tuple(w.shape[2:]) == (1, 1)
