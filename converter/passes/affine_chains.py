"""Affine chains as one BatchNorm: a run of Add, Sub, Mul and Div nodes, each with a
constant of one value per channel (axis 1) or a scalar, computes y = x * a + b per
channel. Exporters write an inference batch norm out so (tf2onnx: Sub(mean), Mul(scale),
Add(beta) after a convolution's bias Add); as one BatchNorm node (gamma = a, beta = b,
mean 0, var 1, epsilon 0) batchnorm_folding.py then folds it into the convolution before
it, and the nodes cost nothing at run time.

A chain starts at a node whose variable operand is a 4-D float32 tensor with a known
channel count; every tensor inside it has that one reader and is no graph output. It is
rewritten only where the BatchNorm folds: elsewhere one BatchNorm step and a separate
activation cost as much as the nodes, the last with its activation fused."""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.bias_folding import _channel_values
from sporenet.converter.passes.graph_utils import add_constant, consumers, producers
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode

AFFINE = (OpCode.ADD, OpCode.SUB, OpCode.MUL, OpCode.DIV)


class _Chain:
    """The nodes of one chain and its per-channel y = x * scale + shift, in float64."""

    def __init__(self, x: int, channels: int) -> None:
        self.x = x
        self.nodes: list[Node] = []
        self.scale, self.shift = np.ones(channels), np.zeros(channels)

    def extend(self, model: Model, node: Node, current: int) -> bool:
        """Take `node` (reading `current`) into the chain if it is an affine step."""
        if node.op not in AFFINE or len(node.inputs) != 2 or "activation" in node.attrs:
            return False
        if node.inputs[0] == node.inputs[1] or current not in node.inputs:
            return False
        k = node.inputs.index(current)
        c = _channel_values(model, node.inputs[1 - k], self.scale.size, 4)
        if c is None:
            return False
        if node.op == OpCode.ADD:
            self.shift = self.shift + c
        elif node.op == OpCode.SUB and k == 0:
            self.shift = self.shift - c
        elif node.op == OpCode.SUB:  # c - y
            self.scale, self.shift = -self.scale, c - self.shift
        elif node.op == OpCode.MUL:
            self.scale, self.shift = self.scale * c, self.shift * c
        elif k == 0 and np.all(c != 0):  # y / c
            self.scale, self.shift = self.scale / c, self.shift / c
        else:
            return False
        self.nodes.append(node)
        return True


def _chain_from(model: Model, graph: Graph, uses: dict, first: Node) -> _Chain | None:
    """The longest chain starting at `first`, or None when `first` starts none."""
    if first.op not in AFFINE or len(first.inputs) != 2:
        return None
    for x in first.inputs:
        tensor = model.tensors[x]
        if tensor.data is not None or len(tensor.shape) != 4 or tensor.dtype != np.float32:
            continue
        channels = tensor.shape[1]
        if channels <= 0 or tensor.quantization is not None:
            continue
        chain = _Chain(x, channels)
        current = x
        node: Node | None = first
        while node is not None and chain.extend(model, node, current):
            current = node.outputs[0]
            readers = uses.get(current, [])
            out = model.tensors[current]
            if len(readers) != 1 or current in graph.outputs or out.quantization is not None:
                break
            node = readers[0]
        if chain.nodes:
            return chain
    return None


def _folds_into(graph: Graph, uses: dict, conv: Node | None, x: int) -> bool:
    """Whether a BatchNorm reading `x` folds into `conv`, its producer (batchnorm_folding
    takes a Conv2D without a fused activation whose output has no other reader)."""
    return (
        conv is not None
        and conv.op == OpCode.CONV2D
        and conv.attrs.get("activation", "none") == "none"
        and len(uses.get(x, [])) == 1
        and x not in graph.outputs
    )


def fold_affine_chains(model: Model) -> int:
    """Rewrite every chain (see the module docstring) as a BatchNorm; returns the count."""
    rewritten = 0
    for graph in model.graphs:
        uses, made = consumers(graph), producers(graph)
        removed: set[int] = set()  # ids of the nodes rewritten (Node compares by value)
        for first in list(graph.nodes):
            if id(first) in removed:
                continue
            chain = _chain_from(model, graph, uses, first)
            if chain is None:
                continue
            if not _folds_into(graph, uses, made.get(chain.x), chain.x):
                continue
            name = chain.nodes[-1].name or "affine"
            channels = chain.scale.size
            params = [
                add_constant(model, f"{name}.{p}", v.astype(np.float32))
                for p, v in (
                    ("gamma", chain.scale),
                    ("beta", chain.shift),
                    ("mean", np.zeros(channels)),
                    ("var", np.ones(channels)),
                )
            ]
            bn = Node(
                OpCode.BATCH_NORM,
                [chain.x, *params],
                list(chain.nodes[-1].outputs),
                attrs={"epsilon": 0.0},
                name=name,
            )
            graph.nodes[graph.nodes.index(chain.nodes[-1])] = bn
            for node in chain.nodes[:-1]:
                graph.nodes.remove(node)
            removed.update(id(node) for node in chain.nodes)
            uses, made = consumers(graph), producers(graph)
            rewritten += 1
    return rewritten
