"""BatchNorm folding: y = BN(conv(x)) becomes one conv with scaled weights and a new bias.

With s = gamma / sqrt(var + eps): W' = W * s (per output channel), b' = (b - mean) * s + beta.
Weights that are constants are rewritten at conversion (in float64, then cast back), in place
when nothing else reads them, so they keep their names (cloud export relies on this: a
folded layer's parameters are still called "conv1.weight"). Weights the runtime folds at
load time (e.g. a ConstantOfShape fill kept small in the file) get a Mul node instead, which
the runtime folds together with them.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import (
    add_constant,
    add_tensor,
    consumers,
    contiguous,
    float_attr,
    producers,
    replace_uses,
    static_value,
)
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode

FOLDS_INTO = (OpCode.CONV2D, OpCode.FULLY_CONNECTED)


def _is_static(model: Model, index: int, made: dict[int, Node], memo: dict[int, bool]) -> bool:
    """Constant, or computed only from constants (folded by the runtime at load time)."""
    if index == -1:
        return True
    if index in memo:
        return memo[index]
    if model.tensors[index].data is not None:
        result = True
    elif index in made:
        memo[index] = False  # guards against cycles in a malformed graph
        result = all(_is_static(model, i, made, memo) for i in made[index].inputs)
    else:
        result = False
    memo[index] = result
    return result


def _reader_counts(model: Model) -> dict[int, int]:
    """Tensor index -> how many node inputs read it, over every graph of the model."""
    counts: dict[int, int] = {}
    for graph in model.graphs:
        for node in graph.nodes:
            for i in node.inputs:
                counts[i] = counts.get(i, 0) + 1
    return counts


def _new_constant(
    model: Model, old: int, name: str, value: np.ndarray, readers: dict[int, int]
) -> int:
    """Constant tensor `old` holding `value` when the folded node is its only reader (it
    keeps its name), else a new constant called `name`; returns the index."""
    if readers.get(old, 0) != 1:
        return add_constant(model, name, value)
    array = contiguous(value)
    array.flags.writeable = False
    tensor = model.tensors[old]
    tensor.data, tensor.shape, tensor.dtype = array, array.shape, array.dtype
    return old


def fold_batch_norms(model: Model) -> int:
    """Fold every foldable BatchNorm into its producer; returns how many were folded."""
    folded = 0
    readers = _reader_counts(model)
    for gi, graph in enumerate(model.graphs):
        uses = consumers(graph)
        made = producers(graph)
        memo: dict[int, bool] = {}
        values: dict[int, np.ndarray | None] = {}
        for bn in list(graph.nodes):
            if bn.op != OpCode.BATCH_NORM or len(bn.inputs) < 5:
                continue
            x = bn.inputs[0]
            prev = made.get(x)
            if prev is None or prev.op not in FOLDS_INTO or len(uses.get(x, [])) != 1:
                continue
            if x in graph.outputs or prev.attrs.get("activation", "none") != "none":
                continue
            # Statistics may be fills the runtime folds at load time: evaluate them here.
            params = [static_value(model, made, i, values) for i in bn.inputs[1:5]]
            if any(p is None for p in params):
                continue
            w_index = prev.inputs[1]
            b_index = prev.inputs[2] if len(prev.inputs) > 2 else -1
            if not (
                _is_static(model, w_index, made, memo) and _is_static(model, b_index, made, memo)
            ):
                continue
            w_tensor = model.tensors[w_index]
            if w_tensor.dtype.kind != "f":
                continue
            channels = w_tensor.shape[0]
            if prev.op == OpCode.FULLY_CONNECTED and len(model.tensors[x].shape) != 2:
                continue  # BatchNorm's channel axis is 1; FC features are the last axis
            gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
            if any(p.size != channels for p in (gamma, beta, mean, var)):
                continue
            eps = float_attr(bn, "epsilon", 1e-5)
            scale = gamma / np.sqrt(var + eps)
            dtype = w_tensor.dtype
            name = w_tensor.name
            shape = (channels,) + (1,) * (len(w_tensor.shape) - 1)
            new_nodes: list[Node] = []
            if w_tensor.data is not None:
                w_new = _new_constant(
                    model,
                    w_index,
                    f"{name}/bn_folded",
                    (w_tensor.data.astype(np.float64) * scale.reshape(shape)).astype(dtype),
                    readers,
                )
            else:
                s_index = add_constant(
                    model, f"{name}/bn_scale", scale.reshape(shape).astype(dtype)
                )
                w_new = add_tensor(model, f"{name}/bn_folded", w_index)
                new_nodes.append(
                    Node(OpCode.MUL, [w_index, s_index], [w_new], name=model.tensors[w_new].name)
                )
            shift = beta - mean * scale
            if b_index == -1:
                # A layer's new bias is named as its weight's sibling ("conv1.bias"), so
                # an exported model's trainable names stay the layers' names.
                bias_name = (
                    f"{name.removesuffix('.weight')}.bias"
                    if name.endswith(".weight")
                    else f"{name}/bn_bias"
                )
                b_new = add_constant(model, bias_name, shift.astype(dtype))
            elif (b_data := model.tensors[b_index].data) is not None:
                b = b_data.astype(np.float64).reshape(-1)
                b_new = _new_constant(
                    model, b_index, f"{name}/bn_bias", (b * scale + shift).astype(dtype), readers
                )
            else:
                s_index = add_constant(model, f"{name}/bn_bias_scale", scale.astype(dtype))
                t_index = add_constant(model, f"{name}/bn_bias_shift", shift.astype(dtype))
                scaled = add_tensor(model, f"{name}/bn_bias_scaled", b_index)
                b_new = add_tensor(model, f"{name}/bn_bias", b_index)
                new_nodes.append(
                    Node(OpCode.MUL, [b_index, s_index], [scaled], name=model.tensors[scaled].name)
                )
                new_nodes.append(
                    Node(OpCode.ADD, [scaled, t_index], [b_new], name=model.tensors[b_new].name)
                )
            prev.inputs = [prev.inputs[0], w_new, b_new]
            position = graph.nodes.index(prev)
            graph.nodes[position:position] = new_nodes
            graph.nodes.remove(bn)
            replace_uses(model, gi, bn.outputs[0], x)
            # The conv output now stands for the normalized value: keep the BN's name on it.
            model.tensors[x].name, model.tensors[bn.outputs[0]].name = (
                model.tensors[bn.outputs[0]].name,
                model.tensors[x].name,
            )
            folded += 1
    return folded
