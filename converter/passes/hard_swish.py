"""HardSwish recognition: x * HardSigmoid(x) with alpha 1/6 and beta 1/2 (how exporters
before opset 14 write HardSwish) becomes one HardSwish node, which then fuses into a
preceding Conv/FullyConnected like any activation."""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import consumers, float_attr, producers
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode


def fuse_hard_swish(model: Model) -> int:
    """Rewrite every x * HardSigmoid(x) (in either order) as HardSwish(x); returns the count."""
    fused = 0
    for graph in model.graphs:
        uses = consumers(graph)
        made = producers(graph)
        for mul in list(graph.nodes):
            if mul.op != OpCode.MUL or len(mul.inputs) != 2 or "activation" in mul.attrs:
                continue
            for gate_index, x in ((mul.inputs[1], mul.inputs[0]), (mul.inputs[0], mul.inputs[1])):
                gate = made.get(gate_index)
                if (
                    gate is None
                    or gate.op != OpCode.HARD_SIGMOID
                    or gate.inputs[0] != x
                    or len(uses.get(gate_index, [])) != 1
                    or gate_index in graph.outputs
                    or abs(float_attr(gate, "alpha", 0.2) - 1 / 6) > 1e-6
                    or abs(float_attr(gate, "beta", 0.5) - 0.5) > 1e-6
                ):
                    continue
                position = graph.nodes.index(mul)
                graph.nodes[position] = Node(
                    OpCode.HARD_SWISH, [x], list(mul.outputs), name=mul.name
                )
                graph.nodes.remove(gate)
                fused += 1
                break
    return fused
