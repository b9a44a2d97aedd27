"""Structural validation of an in-memory model: indices, dtypes, shapes, acyclicity.

Run on every parsed file and before every write. Per-op shape checks happen later, when
the planner prepares each kernel.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite import sparse
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.graph import Graph, Model


def _check_index(index: int, count: int, what: str, *, optional: bool = False) -> None:
    if optional and index == -1:
        return
    if not 0 <= index < count:
        raise ModelFormatError(f"{what}: tensor index {index} out of range (0..{count - 1})")


def _check_graph(model: Model, gi: int, graph: Graph, max_versions: dict[int, int]) -> None:
    n = len(model.tensors)
    where = f"graph {gi} ({graph.name!r})"
    available = {i for i, t in enumerate(model.tensors) if t.data is not None}
    for i in graph.inputs:
        _check_index(i, n, f"{where} input")
        if model.tensors[i].data is not None:
            raise ModelFormatError(f"{where}: input tensor {model.tensors[i].name!r} is a constant")
        available.add(i)
    producer: dict[int, int] = {}
    for j, node in enumerate(graph.nodes):
        what = f"{where} node {j} ({node.op.name})"
        supported = max_versions.get(int(node.op), 1)
        if not 1 <= node.version <= supported:
            raise ModelFormatError(
                f"{what}: op version {node.version} is not supported "
                f"(this runtime has 1..{supported})"
            )
        for i in node.outputs:
            _check_index(i, n, f"{what} output")
            if i in producer or i in available:
                first = (f"node {producer[i]}" if i in producer else "a graph input or constant")
                raise ModelFormatError(
                    f"{what}: output tensor {model.tensors[i].name!r} is already defined by {first}"
                )
            producer[i] = j
    for j, node in enumerate(graph.nodes):
        what = f"{where} node {j} ({node.op.name})"
        for i in node.inputs:
            _check_index(i, n, f"{what} input", optional=True)
            if i != -1 and i not in available:
                if i in producer:
                    kind = "a cycle" if producer[i] >= j else "an ordering error"
                    raise ModelFormatError(
                        f"{what}: input {model.tensors[i].name!r} is produced by node "
                        f"{producer[i]}, which does not come before it ({kind})"
                    )
                raise ModelFormatError(
                    f"{what}: input {model.tensors[i].name!r} is never produced, not a graph "
                    "input and not a constant"
                )
        available.update(node.outputs)
    for i in graph.outputs:
        _check_index(i, n, f"{where} output")
        if i not in available:
            raise ModelFormatError(f"{where}: output {model.tensors[i].name!r} is never produced")


def validate(model: Model) -> Model:
    """Raise ModelFormatError naming the first structural problem of `model`; return it."""
    from sporenet.lite.kernels import max_op_versions

    for i, t in enumerate(model.tensors):
        if t.data is not None:
            if not isinstance(t.data, np.ndarray):
                raise ModelFormatError(f"tensor {t.name!r}: data is not a NumPy array")
            if t.data.dtype != t.dtype or tuple(t.data.shape) != tuple(t.shape):
                raise ModelFormatError(
                    f"tensor {i} ({t.name!r}): declared {t.dtype}{list(t.shape)} but its data "
                    f"is {t.data.dtype}{list(t.data.shape)}"
                )
        sparse.check(t, i)
        q = t.quantization
        if q is not None:
            channels = q.scale.size
            if q.zero_point.size not in (channels, 0):
                raise ModelFormatError(
                    f"tensor {t.name!r}: {channels} scales but {q.zero_point.size} zero points"
                )
            if channels > 1 and (not 0 <= q.axis < len(t.shape) or t.shape[q.axis] != channels):
                raise ModelFormatError(
                    f"tensor {t.name!r}: {channels} per-axis scales do not match axis {q.axis} "
                    f"of shape {list(t.shape)}"
                )
    versions = max_op_versions()
    for gi, graph in enumerate(model.graphs):
        _check_graph(model, gi, graph, versions)
    for key, sig in model.signatures.items():
        if not 0 <= sig.graph < len(model.graphs):
            raise ModelFormatError(
                f"signature {key!r}: graph {sig.graph} out of range (the model has "
                f"{len(model.graphs)})"
            )
        graph = model.graphs[sig.graph]
        for name, i in sig.inputs.items():
            if i not in graph.inputs:
                raise ModelFormatError(
                    f"signature {key!r}: input {name!r} (tensor {i}) is not an input of graph "
                    f"{sig.graph}"
                )
        for name, i in sig.outputs.items():
            if i not in graph.outputs:
                raise ModelFormatError(
                    f"signature {key!r}: output {name!r} (tensor {i}) is not an output of graph "
                    f"{sig.graph}"
                )
    return model
