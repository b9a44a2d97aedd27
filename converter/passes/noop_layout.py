"""Removal of reshapes and transposes that provably do nothing, and merging of chains.

- a Reshape/Flatten/Squeeze/Unsqueeze whose static output shape equals its input shape;
- a Transpose with the identity permutation;
- Reshape after Reshape/Flatten: the second reads the first one's input directly;
- Transpose after Transpose: one Transpose with the composed permutation (or none).
"""

from __future__ import annotations

from sporenet.converter.passes.graph_utils import (
    consumers,
    producers,
    replace_uses,
    static_shape,
)
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode

RESHAPES = (OpCode.RESHAPE, OpCode.FLATTEN, OpCode.SQUEEZE, OpCode.UNSQUEEZE)


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attrs.get("perm")
    return [int(p) for p in perm] if isinstance(perm, list) and perm else list(range(rank))[::-1]


def _bypass(model: Model, gi: int, node: Node) -> bool:
    graph = model.graphs[gi]
    source, target = node.inputs[0], node.outputs[0]
    if target in graph.outputs and source in graph.inputs:
        return False  # the runtime needs a node to produce a graph output from an input
    replace_uses(model, gi, target, source)
    return True


def remove_noop_layout(model: Model) -> int:
    """Apply the rewrites above until none applies; returns how many were made."""
    changes = 0
    for gi, graph in enumerate(model.graphs):
        changed = True
        while changed:
            changed = False
            made = producers(graph)
            uses = consumers(graph)
            for node in graph.nodes:
                if node.op not in (*RESHAPES, OpCode.TRANSPOSE) or not node.inputs:
                    continue
                src, dst = node.inputs[0], node.outputs[0]
                in_shape, out_shape = static_shape(model, src), static_shape(model, dst)
                if (
                    node.op in RESHAPES
                    and in_shape is not None
                    and in_shape == out_shape
                    and _bypass(model, gi, node)
                ):
                    graph.nodes.remove(node)
                    changed = True
                    break
                if node.op == OpCode.TRANSPOSE and in_shape is not None:
                    perm = _perm(node, len(in_shape))
                    if perm == list(range(len(in_shape))) and _bypass(model, gi, node):
                        graph.nodes.remove(node)
                        changed = True
                        break
                before = made.get(src)
                if before is None or len(uses.get(src, [])) != 1 or src in graph.outputs:
                    continue
                if (
                    node.op == OpCode.RESHAPE
                    and before.op in (OpCode.RESHAPE, OpCode.FLATTEN)
                    and out_shape is not None
                ):
                    node.inputs = [before.inputs[0]]
                    node.attrs = {"shape": list(out_shape)}
                    graph.nodes.remove(before)
                    changed = True
                    break
                if node.op == OpCode.TRANSPOSE and before.op == OpCode.TRANSPOSE:
                    rank = len(model.tensors[src].shape)
                    first, second = _perm(before, rank), _perm(node, rank)
                    node.inputs = [before.inputs[0]]
                    node.attrs = {**node.attrs, "perm": [first[j] for j in second]}
                    graph.nodes.remove(before)
                    changed = True
                    break
            changes += changed
    return changes
