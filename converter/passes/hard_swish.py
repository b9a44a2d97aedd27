"""HardSwish recognition: the ways exporters before opset 14 write HardSwish become one
HardSwish node, which then fuses into a preceding Conv/FullyConnected like any activation:

- x * HardSigmoid(x) with alpha 1/6 and beta 1/2 (PyTorch);
- x * Clip(x + 3, 0, 6) / 6, the division possibly a multiplication by 1/6 (Paddle).
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import (
    consumers,
    float_attr,
    fuse_self_gated,
    producers,
)
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode


def fuse_hard_swish(model: Model) -> int:
    """Rewrite every x * HardSigmoid(x) (in either order) and x * Clip(x + 3, 0, 6) / 6 as
    HardSwish(x); returns the count."""
    fused = sum(_fuse_clip_form(model, graph) for graph in model.graphs)
    return fused + fuse_self_gated(
        model,
        OpCode.HARD_SIGMOID,
        OpCode.HARD_SWISH,
        lambda gate, x: (
            abs(float_attr(gate, "alpha", 0.2) - 1 / 6) <= 1e-6
            and abs(float_attr(gate, "beta", 0.5) - 0.5) <= 1e-6
        ),
    )


def _scalar(model: Model, index: int) -> float | None:
    """The value of a constant tensor holding one number (any shape), else None."""
    data = model.tensors[index].data if index != -1 else None
    if data is None or data.size != 1 or data.dtype.kind != "f":
        return None
    return float(np.ravel(data)[0])


def _other(node: Node, index: int) -> int | None:
    """The input of a two-input node that is not `index` (None if `index` is not one)."""
    if len(node.inputs) != 2 or "activation" in node.attrs:
        return None
    a, b = node.inputs
    return b if a == index else a if b == index else None


def _fuse_clip_form(model: Model, graph: Graph) -> int:
    """x * Clip(x + 3, 0, 6) / 6 (or * (1/6), factors in either order) -> HardSwish(x)."""
    fused = 0
    uses = consumers(graph)
    made = producers(graph)
    for last in list(graph.nodes):
        if last.op not in (OpCode.DIV, OpCode.MUL) or len(last.inputs) != 2:
            continue
        if "activation" in last.attrs:
            continue
        k = _scalar(model, last.inputs[1])
        if k is None and last.op == OpCode.MUL:
            k = _scalar(model, last.inputs[0])
            product = last.inputs[1]
        else:
            product = last.inputs[0]
        if k is None or abs((k if last.op == OpCode.DIV else 1 / k) - 6) > 1e-5:
            continue
        mul = made.get(product)
        if mul is None or mul.op != OpCode.MUL or len(mul.inputs) != 2:
            continue
        for clip_index in mul.inputs:
            clip = made.get(clip_index)
            x = _other(mul, clip_index)
            if clip is None or x is None or clip.op != OpCode.CLIP or len(clip.inputs) != 1:
                continue
            if float_attr(clip, "min", -1) != 0 or float_attr(clip, "max", -1) != 6:
                continue
            add = made.get(clip.inputs[0])
            if add is None or add.op != OpCode.ADD or _other(add, x) is None:
                continue
            three = _scalar(model, _other(add, x))  # type: ignore[arg-type]
            if three != 3:
                continue
            inner = (add.outputs[0], clip.outputs[0], product)
            if any(len(uses.get(i, [])) != 1 or i in graph.outputs for i in inner):
                continue
            position = graph.nodes.index(last)
            graph.nodes[position] = Node(OpCode.HARD_SWISH, [x], list(last.outputs), name=last.name)
            for node in (mul, clip, add):
                graph.nodes.remove(node)
            fused += 1
            break
    return fused
