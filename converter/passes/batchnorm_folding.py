"""BatchNorm folding: y = BN(conv(x)) becomes one conv with scaled weights and a new bias.

With s = gamma / sqrt(var + eps): W' = W * s (per output channel), b' = (b - mean) * s + beta.
Weights that are constants are rewritten at conversion (in float64, then cast back), in place
when nothing else reads them, so they keep their names (cloud export relies on this: a
folded layer's parameters are still called "conv1.weight"). Weights the runtime folds at
load time (e.g. a ConstantOfShape fill kept small in the file) get a Mul node instead, which
the runtime folds together with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from sporenet.lite.graph import Graph, Model, Node
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


@dataclass(frozen=True)
class _Fold:
    """A BatchNorm that folds into its producer: y = x * scale + shift per channel."""

    bn: Node
    prev: Node
    w_index: int
    b_index: int  # -1: the producer has no bias
    scale: np.ndarray  # float64, one per output channel
    shift: np.ndarray


@dataclass
class _GraphFacts:
    """What the pass reads of one graph, computed once per graph."""

    uses: dict[int, list[Node]]
    made: dict[int, Node]
    memo: dict[int, bool] = field(default_factory=dict)
    values: dict[int, np.ndarray | None] = field(default_factory=dict)


def fold_batch_norms(model: Model) -> int:
    """Fold every foldable BatchNorm into its producer; returns how many were folded."""
    folded = 0
    readers = _reader_counts(model)
    for gi, graph in enumerate(model.graphs):
        facts = _GraphFacts(consumers(graph), producers(graph))
        for bn in list(graph.nodes):
            fold = _foldable(model, graph, bn, facts)
            if fold is None:
                continue
            new_nodes: list[Node] = []
            w_new = _scaled_weight(model, fold, readers, new_nodes)
            b_new = _folded_bias(model, fold, readers, new_nodes)
            _rewrite(model, gi, fold, w_new, b_new, new_nodes)
            folded += 1
    return folded


def _foldable(model: Model, graph: Graph, bn: Node, facts: _GraphFacts) -> _Fold | None:
    """The fold of `bn`, or None when it is no BatchNorm over a foldable producer's
    only output, or its statistics or the producer's weights are not known here."""
    if bn.op != OpCode.BATCH_NORM or len(bn.inputs) < 5:
        return None
    x = bn.inputs[0]
    prev = facts.made.get(x)
    if prev is None or prev.op not in FOLDS_INTO or len(facts.uses.get(x, [])) != 1:
        return None
    if x in graph.outputs or prev.attrs.get("activation", "none") != "none":
        return None
    # Statistics may be fills the runtime folds at load time: evaluate them here.
    params = [static_value(model, facts.made, i, facts.values) for i in bn.inputs[1:5]]
    if any(p is None for p in params):
        return None
    w_index = prev.inputs[1]
    b_index = prev.inputs[2] if len(prev.inputs) > 2 else -1
    if not (
        _is_static(model, w_index, facts.made, facts.memo)
        and _is_static(model, b_index, facts.made, facts.memo)
    ):
        return None
    w_tensor = model.tensors[w_index]
    if w_tensor.dtype.kind != "f":
        return None
    if prev.op == OpCode.FULLY_CONNECTED and len(model.tensors[x].shape) != 2:
        return None  # BatchNorm's channel axis is 1; FC features are the last axis
    gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    if any(p.size != w_tensor.shape[0] for p in (gamma, beta, mean, var)):
        return None
    scale = gamma / np.sqrt(var + float_attr(bn, "epsilon", 1e-5))
    return _Fold(bn, prev, w_index, b_index, scale, beta - mean * scale)


def _scaled_weight(
    model: Model, fold: _Fold, readers: dict[int, int], new_nodes: list[Node]
) -> int:
    """W * scale per output channel: computed now for a constant, else a Mul node."""
    w_tensor = model.tensors[fold.w_index]
    dtype, name = w_tensor.dtype, w_tensor.name
    shape = (w_tensor.shape[0],) + (1,) * (len(w_tensor.shape) - 1)
    if w_tensor.data is not None:
        return _new_constant(
            model,
            fold.w_index,
            f"{name}/bn_folded",
            (w_tensor.data.astype(np.float64) * fold.scale.reshape(shape)).astype(dtype),
            readers,
        )
    s_index = add_constant(model, f"{name}/bn_scale", fold.scale.reshape(shape).astype(dtype))
    w_new = add_tensor(model, f"{name}/bn_folded", fold.w_index)
    new_nodes.append(
        Node(OpCode.MUL, [fold.w_index, s_index], [w_new], name=model.tensors[w_new].name)
    )
    return w_new


def _folded_bias(model: Model, fold: _Fold, readers: dict[int, int], new_nodes: list[Node]) -> int:
    """b * scale + shift (shift alone without a bias): a constant, or Mul and Add nodes."""
    w_tensor = model.tensors[fold.w_index]
    dtype, name = w_tensor.dtype, w_tensor.name
    scale, shift, b_index = fold.scale, fold.shift, fold.b_index
    if b_index == -1:
        # A layer's new bias is named as its weight's sibling ("conv1.bias"), so
        # an exported model's trainable names stay the layers' names.
        bias_name = (
            f"{name.removesuffix('.weight')}.bias"
            if name.endswith(".weight")
            else f"{name}/bn_bias"
        )
        return add_constant(model, bias_name, shift.astype(dtype))
    if (b_data := model.tensors[b_index].data) is not None:
        b = b_data.astype(np.float64).reshape(-1)
        return _new_constant(
            model, b_index, f"{name}/bn_bias", (b * scale + shift).astype(dtype), readers
        )
    s_index = add_constant(model, f"{name}/bn_bias_scale", scale.astype(dtype))
    t_index = add_constant(model, f"{name}/bn_bias_shift", shift.astype(dtype))
    scaled = add_tensor(model, f"{name}/bn_bias_scaled", b_index)
    b_new = add_tensor(model, f"{name}/bn_bias", b_index)
    new_nodes.append(
        Node(OpCode.MUL, [b_index, s_index], [scaled], name=model.tensors[scaled].name)
    )
    new_nodes.append(Node(OpCode.ADD, [scaled, t_index], [b_new], name=model.tensors[b_new].name))
    return b_new


def _rewrite(
    model: Model, gi: int, fold: _Fold, w_new: int, b_new: int, new_nodes: list[Node]
) -> None:
    """The producer reads the folded weight and bias; the BatchNorm goes."""
    graph, prev, bn = model.graphs[gi], fold.prev, fold.bn
    x = bn.inputs[0]
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
