"""Layer normalization recognition: the written-out form TFLite files carry (Keras's
LayerNormalization as the TFLite converter lowers it) becomes one LAYER_NORM node.

    m = Mean(x, trailing axes, keepdims)    d = x - m        v = Mean(d * d, same axes)
    y = d * Rsqrt(v + eps)  [* gamma]  [+ beta]

That is eight to ten nodes, each a step of its own at run time; on the short rows of a
wake-word head their per-step cost, not their arithmetic, sets the time. LAYER_NORM
computes the same function in one step. Recognized: d * d or Square(d), either operand
order of the products and of the epsilon Add, and optional constant gamma and beta that
broadcast over the normalized axes only. A beta Add with a fused activation stays a node
of its own (LAYER_NORM has no activation). Every intermediate must have the chain as its
only reader; anything else leaves the graph as it was.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import add_constant, consumers, producers
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode


def fuse_layer_norms(model: Model) -> int:
    """Rewrite every written-out float layer normalization as LAYER_NORM; returns the
    count."""
    return sum(_fuse_graph(model, graph) for graph in model.graphs)


class _Chain:
    """The graph's readers and writers, and the checks every matched node must pass."""

    def __init__(self, model: Model, graph: Graph) -> None:
        self.model, self.graph = model, graph
        self.uses, self.made = consumers(graph), producers(graph)

    def readers(self, index: int) -> list[Node]:
        """The nodes reading tensor `index`; none when it is a graph output (it must stay)."""
        return [] if index in self.graph.outputs else self.uses.get(index, [])

    def only_reader(self, index: int) -> Node | None:
        readers = self.readers(index)
        return readers[0] if len(readers) == 1 else None

    def plain(self, node: Node | None, op: OpCode, arity: int) -> Node | None:
        """`node` when it is `op` with `arity` inputs and no fused activation."""
        ok = node is not None and node.op == op and len(node.inputs) == arity
        return node if ok and not node.attrs.get("activation") else None  # type: ignore[union-attr]

    def other(self, node: Node, index: int) -> int:
        a, b = node.inputs
        return b if a == index else a

    def constant(self, index: int) -> np.ndarray | None:
        data = self.model.tensors[index].data
        return data if data is not None and data.dtype.kind == "f" else None

    def mean_axes(self, node: Node | None, rank: int) -> tuple[int, ...] | None:
        """The axes of a keepdims REDUCE_MEAN over trailing axes of a rank-`rank` tensor,
        else None."""
        if node is None or node.op != OpCode.REDUCE_MEAN or len(node.inputs) != 1:
            return None
        axes = node.attrs.get("axes")
        keepdims = node.attrs.get("keepdims", 1)
        if not isinstance(axes, list) or not axes or keepdims != 1:
            return None
        normalized = sorted({int(a) % rank for a in axes if -rank <= int(a) < rank})
        if len(normalized) != len(axes) or normalized != list(range(normalized[0], rank)):
            return None
        return tuple(normalized)

    def affine(self, value: int, rank: int, first: int, op: OpCode) -> tuple[Node, int] | None:
        """The plain `op` node applying a constant (broadcast over axes >= `first` only) to
        `value`, and that constant's index; else None."""
        node = self.plain(self.only_reader(value), op, 2)
        if node is None:
            return None
        k = self.other(node, value)
        data = self.constant(k)
        if k == value or data is None or data.ndim > rank:
            return None
        shape = (1,) * (rank - data.ndim) + data.shape
        if any(s != 1 for s in shape[:first]):
            return None
        return node, k


def _match(chain: _Chain, mean: Node) -> tuple[list[Node], int, float] | None:
    """The nodes from the first Mean to y = d * rsqrt(v + eps), x and eps; else None."""
    x = mean.inputs[0]
    tensor = chain.model.tensors[x]
    rank = len(tensor.shape)
    axes = chain.mean_axes(mean, rank)
    if axes is None or tensor.dtype.kind != "f" or tensor.data is not None:
        return None
    sub = chain.plain(chain.only_reader(mean.outputs[0]), OpCode.SUB, 2)
    if sub is None or sub.inputs != [x, mean.outputs[0]]:
        return None
    d = sub.outputs[0]
    readers = chain.readers(d)
    square = next((n for n in readers if _squares(chain, n, d)), None)
    if square is None:
        return None
    scaled = [n for n in readers if n is not square]
    if len(scaled) != 1 or chain.plain(scaled[0], OpCode.MUL, 2) is None:
        return None
    var = chain.only_reader(square.outputs[0])
    if chain.mean_axes(var, rank) != axes:
        return None
    add = chain.plain(chain.only_reader(var.outputs[0]), OpCode.ADD, 2)  # type: ignore[union-attr]
    if add is None:
        return None
    eps = chain.constant(chain.other(add, var.outputs[0]))  # type: ignore[union-attr]
    if eps is None or eps.size != 1 or not float(eps.flat[0]) >= 0:
        return None
    rsqrt = chain.plain(chain.only_reader(add.outputs[0]), OpCode.RSQRT, 1)
    if rsqrt is None or chain.only_reader(rsqrt.outputs[0]) is not scaled[0]:
        return None
    if chain.other(scaled[0], rsqrt.outputs[0]) != d:
        return None
    return [mean, sub, square, var, add, rsqrt, scaled[0]], x, float(eps.flat[0])  # type: ignore[list-item]


def _squares(chain: _Chain, node: Node, d: int) -> bool:
    """Whether `node` is d * d or Square(d)."""
    if chain.plain(node, OpCode.MUL, 2) is not None:
        return node.inputs == [d, d]
    return chain.plain(node, OpCode.SQUARE, 1) is not None


def _fuse_graph(model: Model, graph: Graph) -> int:
    chain = _Chain(model, graph)
    fused = 0
    for mean in [n for n in graph.nodes if n.op == OpCode.REDUCE_MEAN]:
        if mean not in graph.nodes:
            continue
        found = _match(chain, mean)
        if found is None:
            continue
        nodes, x, eps = found
        rank = len(model.tensors[x].shape)
        first = chain.mean_axes(mean, rank)[0]  # type: ignore[index]
        normalized = tuple(model.tensors[x].shape[first:])
        if any(d < 0 for d in normalized):
            continue  # a dynamic normalized axis: gamma cannot be laid out
        dtype = model.tensors[x].dtype
        last = nodes[-1]
        gamma_match = chain.affine(last.outputs[0], rank, first, OpCode.MUL)
        gamma = _normalized(model, gamma_match[1], normalized, dtype) if gamma_match else None
        if gamma_match is not None and gamma is not None:
            nodes.append(gamma_match[0])
        else:
            gamma = np.ones(normalized, dtype)
        beta_match = chain.affine(nodes[-1].outputs[0], rank, first, OpCode.ADD)
        beta = _normalized(model, beta_match[1], normalized, dtype) if beta_match else None
        if beta_match is not None and beta is not None:
            nodes.append(beta_match[0])
        inputs = [x, add_constant(model, f"{last.name}_gamma", gamma)]
        if beta_match is not None and beta is not None:
            inputs.append(add_constant(model, f"{last.name}_beta", beta))
        tail = nodes[-1]
        graph.nodes[graph.nodes.index(tail)] = Node(
            OpCode.LAYER_NORM,
            inputs,
            list(tail.outputs),
            name=tail.name,
            attrs={"axis": first, "epsilon": eps},
        )
        for node in nodes[:-1]:
            graph.nodes.remove(node)
        chain = _Chain(model, graph)
        fused += 1
    return fused


def _normalized(
    model: Model, index: int, normalized: tuple[int, ...], dtype: np.dtype
) -> np.ndarray | None:
    """Constant `index` laid out over the normalized axes (its leading 1s dropped, then
    broadcast), as a copy in x's dtype; None when it does not fit them."""
    data = model.tensors[index].data
    if data is None:
        return None
    value = data.reshape(data.shape[max(data.ndim - len(normalized), 0) :]) if data.size else data
    try:
        return np.broadcast_to(value, normalized).astype(dtype)
    except ValueError:
        return None
