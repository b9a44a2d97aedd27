"""Dead-node elimination: nodes none of whose outputs reach a graph output are dropped."""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.lite.graph import Model


def eliminate_dead_nodes(model: Model) -> int:
    """Remove nodes that do not contribute to any graph output, then unused tensors."""
    removed = 0
    for graph in model.graphs:
        live = set(graph.outputs)
        kept = []
        for node in reversed(graph.nodes):
            if any(i in live for i in node.outputs):
                kept.append(node)
                live.update(i for i in node.inputs if i != -1)
            else:
                removed += 1
        graph.nodes = kept[::-1]
    compact_tensors(model)
    return removed
