"""Which constant tensors a model's graphs write in place (its training state).

A "train" graph ends with optimizer update nodes that overwrite their parameter and slots
(momentum, Adam moments, step count), its BatchNorms in training form update their
running statistics and its Dropouts advance their random step counters. A runtime that
runs such a graph must give those tensors writable storage of its own (a loaded model's
data may be a read-only view of the file) and share it between the signatures, so the
infer graph sees what the train graph learned.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.graph import Model
from sporenet.lite.opset.decl import derived_map
from sporenet.lite.stream_windows import stream_windows

WRITTEN_INPUTS = derived_map(lambda d: d.writes or None)
"""Input positions each op writes in place (declared with the op, lite/opset/)."""


def state_tensors(model: Model) -> list[int]:
    """Indices of the constant tensors any graph of `model` writes, sorted."""
    written = set()
    for graph in model.graphs:
        for node in graph.nodes:
            for k in WRITTEN_INPUTS.get(node.op, ()):
                if k < len(node.inputs) and node.inputs[k] != -1:
                    written.add(node.inputs[k])
    return sorted(i for i in written if model.tensors[i].data is not None)


def writable_copies(model: Model, indices: list[int]) -> dict[int, np.ndarray]:
    """Writable copies of the tensors' data (the model's own arrays stay untouched).

    A streaming state (Window) is stored as the head of a buffer of its concatenation's
    shape, which the plan then uses as that concatenation's output."""
    copies = {i: np.array(model.tensors[i].data, copy=True) for i in indices}
    for g in range(len(model.graphs)):
        for window in stream_windows(model, g):
            if window.variable not in copies:
                continue
            joined = model.tensors[window.joined]
            host = np.zeros(tuple(joined.shape), copies[window.variable].dtype)
            head = host[window.head(host.ndim)]
            head[...] = copies[window.variable]
            copies[window.variable] = head
    return copies
