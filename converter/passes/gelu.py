"""GELU recognition: x * 0.5 * (1 + Erf(x / sqrt 2)), as exporters write the exact GELU
before ONNX opset 20 (PyTorch's nn.GELU, Hugging Face transformers), becomes one GELU
node.

The written-out form is five nodes, each a pass over the whole tensor (Erf alone about
twenty); GELU computes the same function in one blocked step. Recognized: the division by
sqrt 2 or the multiplication by 1 / sqrt 2, the Add of 1 in either operand order, and the
two products of x, 0.5 and (1 + erf) in any grouping and order. Every intermediate must
have the chain as its only reader and no constant may broadcast x to a larger shape;
anything else leaves the graph as it was.
"""

from __future__ import annotations

import math

import numpy as np

from sporenet.converter.passes.graph_utils import consumers, producers
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode

SQRT2 = math.sqrt(2)
TOLERANCE = 1e-6
"""Relative tolerance on the constants (they are stored in float32)."""


def fuse_gelu(model: Model) -> int:
    """Rewrite every float x * 0.5 * (1 + Erf(x / sqrt 2)) as GELU(x); returns the count."""
    return sum(_fuse_graph(model, graph) for graph in model.graphs)


def _near(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= TOLERANCE * abs(want)


class _Chain:
    """The graph's readers and writers, and the checks every matched node must pass."""

    def __init__(self, model: Model, graph: Graph) -> None:
        self.model, self.graph = model, graph
        self.uses, self.made = consumers(graph), producers(graph)

    def scalar(self, index: int, like: int) -> float | None:
        """The value of a float constant holding one number that does not broadcast tensor
        `like` to a higher rank, else None."""
        data = self.model.tensors[index].data
        if data is None or data.size != 1 or data.dtype.kind != "f":
            return None
        if data.ndim > len(self.model.tensors[like].shape):
            return None
        return float(np.ravel(data)[0])

    def only_reader(self, index: int) -> Node | None:
        """The one node reading tensor `index` (read once, not a graph output), else None."""
        readers = self.uses.get(index, [])
        if len(readers) != 1 or index in self.graph.outputs:
            return None
        return readers[0]

    def binary(self, node: Node | None, op: OpCode) -> Node | None:
        """`node` when it is a plain two-input `op` (no fused activation), else None."""
        ok = node is not None and node.op == op and len(node.inputs) == 2
        return node if ok and "activation" not in node.attrs else None  # type: ignore[union-attr]

    def other(self, node: Node, index: int) -> int:
        a, b = node.inputs
        return b if a == index else a

    def scaled_input(self, erf: Node) -> int | None:
        """x, when Erf reads x / sqrt 2 or x * (1 / sqrt 2) computed for it alone."""
        z = erf.inputs[0]
        node = self.made.get(z)
        if self.only_reader(z) is not erf or node is None:
            return None
        div = self.binary(node, OpCode.DIV)
        if div is not None and _near(self.scalar(div.inputs[1], div.inputs[0]), SQRT2):
            return div.inputs[0]
        mul = self.binary(node, OpCode.MUL)
        for x, k in (mul.inputs, mul.inputs[::-1]) if mul is not None else ():
            if _near(self.scalar(k, x), 1 / SQRT2):
                return x
        return None

    def is_half(self, index: int, x: int) -> bool:
        return _near(self.scalar(index, x), 0.5)

    def products(self, one_plus: int, x: int) -> tuple[list[Node], Node] | None:
        """The products of (1 + erf), x and 0.5: (the nodes, the last one), else None."""
        m1 = self.binary(self.only_reader(one_plus), OpCode.MUL)
        if m1 is None:
            return None
        o1 = self.other(m1, one_plus)
        if o1 == x or self.is_half(o1, x):  # (x or 0.5) * (1 + erf), then times the other
            m2 = self.binary(self.only_reader(m1.outputs[0]), OpCode.MUL)
            if m2 is None:
                return None
            o2 = self.other(m2, m1.outputs[0])
            if (o1 == x and self.is_half(o2, x)) or (o1 != x and o2 == x):
                return [m1, m2], m2
            return None
        half_x = self.binary(self.made.get(o1), OpCode.MUL)  # (x * 0.5) * (1 + erf)
        if half_x is None or self.only_reader(o1) is not m1 or x not in half_x.inputs:
            return None
        if not self.is_half(self.other(half_x, x), x):
            return None
        return [half_x, m1], m1


def _fuse_graph(model: Model, graph: Graph) -> int:
    chain = _Chain(model, graph)
    fused = 0
    for erf in [n for n in graph.nodes if n.op == OpCode.ERF and len(n.inputs) == 1]:
        x = chain.scaled_input(erf)
        if x is None or model.tensors[x].dtype.kind != "f" or "activation" in erf.attrs:
            continue
        add = chain.binary(chain.only_reader(erf.outputs[0]), OpCode.ADD)
        if add is None or chain.scalar(chain.other(add, erf.outputs[0]), x) != 1.0:
            continue
        found = chain.products(add.outputs[0], x)
        if found is None:
            continue
        muls, last = found
        scale = chain.made[erf.inputs[0]]
        graph.nodes[graph.nodes.index(last)] = Node(
            OpCode.GELU, [x], list(last.outputs), name=last.name, attrs={"approximate": "none"}
        )
        for node in (scale, erf, add, *muls):
            if node is not last:
                graph.nodes.remove(node)
        chain = _Chain(model, graph)
        fused += 1
    return fused
