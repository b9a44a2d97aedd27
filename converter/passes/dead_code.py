"""Dead-node elimination: nodes none of whose outputs reach a graph output are dropped,
except those that write a variable (ASSIGN and the other ops of lite/variables.py): their
effect is the state the next run reads."""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.lite.graph import Model, Node
from sporenet.lite.variables import WRITTEN_INPUTS


def eliminate_dead_nodes(model: Model) -> int:
    """Remove nodes that do not contribute to any graph output, then unused tensors."""
    removed = 0
    for graph in model.graphs:
        live = set(graph.outputs)
        kept = []
        for node in reversed(graph.nodes):
            if _writes_state(model, node) or any(i in live for i in node.outputs):
                kept.append(node)
                live.update(i for i in node.inputs if i != -1)
            else:
                removed += 1
        graph.nodes = kept[::-1]
    compact_tensors(model)
    return removed


def _writes_state(model: Model, node: Node) -> bool:
    """Whether the node writes a constant tensor (a variable) in place."""
    return any(
        k < len(node.inputs)
        and node.inputs[k] != -1
        and model.tensors[node.inputs[k]].data is not None
        for k in WRITTEN_INPUTS.get(node.op, ())
    )
