"""Bias folding: Add(conv(x), c) with a constant c of one value per output channel becomes
the convolution's own bias (exporters such as Paddle's write a bias as a separate Add of a
(1, O, 1, 1) constant). The kernel then adds it inside its main step, one step fewer.

A 1-D convolution exported as Unsqueeze -> Conv -> Squeeze (tf2onnx's Keras Conv1D) adds
its bias after the Squeeze, as a (1, O, 1) constant: that Add folds the same way when the
Squeeze keeps the batch and channel axes."""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import (
    add_constant,
    consumers,
    producers,
    replace_uses,
)
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode


def _channel_values(model: Model, index: int, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts as one value per channel of axis 1 of a rank-`rank`
    tensor ((O, 1, 1), (1, O, 1, 1), ...), as an (O,) float64 array; else None."""
    data = model.tensors[index].data
    if data is None or data.dtype.kind != "f" or data.ndim > rank:
        return None
    shape = (1,) * (rank - data.ndim) + tuple(data.shape)
    if shape[1] not in (1, channels) or any(d != 1 for k, d in enumerate(shape) if k != 1):
        return None
    return np.broadcast_to(data.reshape(-1).astype(np.float64), (channels,))


def _convolution(
    graph: Graph, made: dict[int, Node], uses: dict[int, list[Node]], x: int
) -> tuple[Node | None, int]:
    """(the Conv2D without a fused activation whose output tensor `x` is, or is a Squeeze
    of that keeps axes 0 and 1, the rank of `x`); (None, 0) otherwise."""
    node = made.get(x)
    rank = 4
    if node is not None and node.op == OpCode.SQUEEZE and len(node.inputs) == 1:
        axes = node.attrs.get("axes")
        if not isinstance(axes, list | tuple) or not axes:
            return None, 0
        inner = node.inputs[0]
        kept = {a % 4 for a in axes if isinstance(a, int)}
        if len(kept) != len(axes) or kept & {0, 1}:
            return None, 0
        if len(uses.get(inner, [])) != 1 or inner in graph.outputs:
            return None, 0
        node, rank = made.get(inner), 4 - len(kept)
    if node is None or node.op != OpCode.CONV2D:
        return None, 0
    if node.attrs.get("activation", "none") != "none":
        return None, 0
    return node, rank


def fold_biases(model: Model) -> int:
    """Fold every Add of a per-channel constant into the Conv2D before it; returns the
    count."""
    folded = 0
    for gi, graph in enumerate(model.graphs):
        uses = consumers(graph)
        made = producers(graph)
        for add in list(graph.nodes):
            if add.op != OpCode.ADD or len(add.inputs) != 2 or "activation" in add.attrs:
                continue
            for x, c in (add.inputs, add.inputs[::-1]):
                conv, rank = _convolution(graph, made, uses, x)
                if (
                    conv is None
                    or len(uses.get(x, [])) != 1
                    or x in graph.outputs
                    or model.tensors[x].shape != model.tensors[add.outputs[0]].shape
                ):
                    continue
                w = model.tensors[conv.inputs[1]]
                if w.data is None or w.dtype.kind != "f" or len(w.shape) != 4:
                    continue
                values = _channel_values(model, c, w.shape[0], rank)
                b_index = conv.inputs[2] if len(conv.inputs) > 2 else -1
                old = model.tensors[b_index].data if b_index != -1 else 0.0
                if values is None or old is None:
                    continue
                bias = (np.asarray(old, np.float64) + values).astype(w.dtype)
                name = f"{w.name.removesuffix('.weight')}.bias"
                conv.inputs = [conv.inputs[0], conv.inputs[1], add_constant(model, name, bias)]
                graph.nodes.remove(add)
                replace_uses(model, gi, add.outputs[0], x)
                # The conv output now stands for the sum: keep the Add's name on it.
                model.tensors[x].name, model.tensors[add.outputs[0]].name = (
                    model.tensors[add.outputs[0]].name,
                    model.tensors[x].name,
                )
                folded += 1
                break
    return folded
