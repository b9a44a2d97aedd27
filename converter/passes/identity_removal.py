"""Identity/Dropout removal: nodes that copy their input are bypassed, and so are Casts
to the dtype their input already has (tf2onnx writes one around most ops of a float
graph; each would copy its tensor at run time)."""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import replace_uses
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode

PASS_THROUGH = (OpCode.IDENTITY, OpCode.DROPOUT)


def _copies(model: Model, node: Node) -> bool:
    """Whether `node` only copies its input: Identity, Dropout, a Cast to the same dtype."""
    if not node.inputs or node.inputs[0] == -1:
        return False
    if node.op == OpCode.CAST:
        tensors = model.tensors
        source, target = tensors[node.inputs[0]], tensors[node.outputs[0]]
        plain = source.quantization is None and target.quantization is None
        return len(node.inputs) == 1 and plain and source.dtype == target.dtype
    return node.op in PASS_THROUGH


def remove_identities(model: Model) -> int:
    """Bypass Identity, (inference) Dropout and same-dtype Cast nodes; returns how many
    were removed."""
    removed = 0
    for gi, graph in enumerate(model.graphs):
        kept = []
        for node in graph.nodes:
            if _copies(model, node):
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
