"""Identity/Dropout removal: nodes that copy their input are bypassed."""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import replace_uses
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode

PASS_THROUGH = (OpCode.IDENTITY, OpCode.DROPOUT)


def remove_identities(model: Model) -> int:
    """Bypass Identity and (inference) Dropout nodes; returns how many were removed."""
    removed = 0
    for gi, graph in enumerate(model.graphs):
        kept = []
        for node in graph.nodes:
            if node.op in PASS_THROUGH and node.inputs and node.inputs[0] != -1:
                source, target = node.inputs[0], node.outputs[0]
                # A graph input passed straight to a graph output keeps its Identity: the
                # runtime needs a node to copy the value into the output tensor.
                if target in graph.outputs and source in graph.inputs:
                    kept.append(node)
                    continue
                replace_uses(model, gi, target, source)
                removed += 1
                continue
            kept.append(node)
        graph.nodes = kept
    return removed
