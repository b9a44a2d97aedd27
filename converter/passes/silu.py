"""SiLU recognition: x * Sigmoid(x), as exporters write SiLU/Swish (PyTorch's nn.SiLU before
opset 24, YOLO-style detectors, TFLite's LOGISTIC + MUL), becomes one SILU node, which then
fuses into a preceding Conv/FullyConnected/Add like any activation.

SILU computes x / (1 + exp(-x)) in one step: the four passes of Sigmoid without the fifth
pass and the node of the product.
"""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import consumers, producers
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode


def fuse_silu(model: Model) -> int:
    """Rewrite every float x * Sigmoid(x) (either operand order) as SILU(x) when the
    Sigmoid's output has no other reader and is not a graph output; returns the count."""
    return sum(_fuse_graph(model, graph) for graph in model.graphs)


def _fuse_graph(model: Model, graph: Graph) -> int:
    fused = 0
    uses = consumers(graph)
    made = producers(graph)
    for mul in list(graph.nodes):
        if mul.op != OpCode.MUL or len(mul.inputs) != 2 or "activation" in mul.attrs:
            continue
        a, b = mul.inputs
        for gate_index, x in ((b, a), (a, b)):
            gate = made.get(gate_index)
            if (
                gate is None
                or gate.op != OpCode.SIGMOID
                or gate.inputs != [x]
                or "activation" in gate.attrs
                or len(uses.get(gate_index, [])) != 1
                or gate_index in graph.outputs
                or model.tensors[x].dtype.kind != "f"
            ):
                continue
            position = graph.nodes.index(mul)
            graph.nodes[position] = Node(OpCode.SILU, [x], list(mul.outputs), name=mul.name)
            graph.nodes.remove(gate)
            fused += 1
            break
    return fused
