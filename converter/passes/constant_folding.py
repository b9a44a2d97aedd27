"""Constant folding: nodes whose inputs are all constants are evaluated once, at conversion.

A result much larger than its inputs (a fill, an Expand) is left as a node: the runtime
folds it when the model loads, and the file stays small.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import should_materialize
from sporenet.lite.eager import fold_node
from sporenet.lite.graph import Model
from sporenet.lite.kernels.base import TensorSpec


def _declared_bytes(model: Model, outputs: list[int]) -> int:
    """The outputs' bytes by their stored shapes; 0 when a dimension is not known."""
    total = 0
    for i in outputs:
        tensor = model.tensors[i]
        if any(d < 0 for d in tensor.shape):
            return 0
        total += int(np.prod(tensor.shape, dtype=np.int64)) * tensor.dtype.itemsize
    return total


def fold_constants(model: Model) -> int:
    """Replace all-constant nodes by constant tensors; returns how many nodes were folded."""
    folded = 0
    for graph in model.graphs:
        kept = []
        for node in graph.nodes:
            tensors = [model.tensors[i] if i != -1 else None for i in node.inputs]
            if any(t is not None and t.data is None for t in tensors):
                kept.append(node)
                continue
            in_bytes = sum(t.data.nbytes for t in tensors if t is not None and t.data is not None)
            if not should_materialize(_declared_bytes(model, node.outputs), in_bytes):
                kept.append(node)  # known too large from the stored shapes: not computed
                continue
            specs = [
                None if t is None else TensorSpec(tuple(t.shape), t.dtype, t.data, t.quantization)
                for t in tensors
            ]
            # None also for a kernel that refuses the inputs: the runtime reports it with
            # full context.
            values = fold_node(model, node, specs)
            if values is None or not all(should_materialize(v.nbytes, in_bytes) for v in values):
                kept.append(node)
                continue
            for i, value in zip(node.outputs, values, strict=False):
                value.flags.writeable = False
                tensor = model.tensors[i]
                tensor.data, tensor.shape, tensor.dtype = value, value.shape, value.dtype
            folded += 1
        graph.nodes = kept
    return folded
