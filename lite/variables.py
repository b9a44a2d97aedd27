"""Which constant tensors a model's graphs write in place (its training state).

A "train" graph ends with optimizer update nodes that overwrite their parameter and slots
(momentum, Adam moments, step count), its BatchNorms in training form update their
running statistics and its Dropouts advance their random step counters. A runtime that
runs such a graph must give those tensors writable storage of its own (a loaded model's
data may be a read-only view of the file) and share it between the signatures, so the
infer graph sees what the train graph learned.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_map

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


@dataclass(frozen=True)
class Window:
    """A streaming state: a variable read only into the head of a CONCAT along `axis`
    (output `joined`) and written only by the ASSIGN at node `assign` of the last
    `length` entries of that output. Stored as the head of the output's own buffer, the
    concat copies nothing for it and the ASSIGN is one shift inside that buffer."""

    variable: int
    joined: int
    axis: int
    length: int
    assign: int

    def head(self, rank: int) -> tuple[slice, ...]:
        return tuple(slice(0, self.length) if d == self.axis else slice(None) for d in range(rank))

    def tail(self, shape: tuple[int, ...]) -> tuple[slice, ...]:
        start = shape[self.axis] - self.length
        return tuple(
            slice(start, None) if d == self.axis else slice(None) for d in range(len(shape))
        )


def stream_windows(model: Model, graph_index: int) -> list[Window]:
    """The streaming states of one graph (see Window), found from the model's shapes."""
    graph = model.graphs[graph_index]
    uses = Counter(i for g in model.graphs for n in g.nodes for i in n.inputs)
    uses.update(i for g in model.graphs for i in g.outputs)
    readers: dict[int, list[tuple[int, int]]] = {}
    producer: dict[int, int] = {}
    for j, node in enumerate(graph.nodes):
        for k, i in enumerate(node.inputs):
            readers.setdefault(i, []).append((j, k))
        for i in node.outputs:
            producer[i] = j
    windows = []
    for node in graph.nodes:
        if node.op != OpCode.READ_VARIABLE or uses[node.inputs[0]] != 2:
            continue
        window = _window(model, graph, node, readers, producer)
        if window is not None:
            windows.append(window)
    return windows


def _window(
    model: Model,
    graph: Graph,
    read: Node,
    readers: dict[int, list[tuple[int, int]]],
    producer: dict[int, int],
) -> Window | None:
    """The Window of a READ_VARIABLE, or None when its variable is used otherwise."""
    var, value = read.inputs[0], read.outputs[0]
    if model.tensors[var].data is None or value in graph.outputs:
        return None
    joins = readers.get(value, [])
    if len(joins) != 1 or joins[0][1] != 0 or graph.nodes[joins[0][0]].op != OpCode.CONCAT:
        return None
    concat = graph.nodes[joins[0][0]]
    joined = concat.outputs[0]
    shape = tuple(model.tensors[joined].shape)
    vshape = tuple(model.tensors[var].shape)
    if joined in graph.outputs or any(d < 0 for d in shape) or len(vshape) != len(shape):
        return None
    axis = concat.attrs.get("axis", 0)
    if not isinstance(axis, int):
        return None
    axis %= len(shape)
    length = vshape[axis]
    if vshape != (*shape[:axis], length, *shape[axis + 1 :]) or not 0 < length < shape[axis]:
        return None
    for j, k in readers.get(var, []):
        node = graph.nodes[j]
        if node.op == OpCode.ASSIGN and k == 0 and len(node.inputs) == 2:
            source = producer.get(node.inputs[1])
            if source is not None and _takes_tail(graph.nodes[source], joined, shape, axis, length):
                return Window(var, joined, axis, length, j)
    return None


def _takes_tail(node: Node, joined: int, shape: tuple[int, ...], axis: int, length: int) -> bool:
    """Whether `node` is a SLICE of `joined` taking its last `length` entries on `axis`."""
    if node.op != OpCode.SLICE or node.inputs[:1] != [joined] or len(node.inputs) != 1:
        return False
    a = node.attrs
    starts, ends = a.get("starts"), a.get("ends")
    axes, steps = a.get("axes", list(range(len(shape)))), a.get("steps")
    if not isinstance(starts, list) or not isinstance(ends, list) or not isinstance(axes, list):
        return False
    steps = steps if isinstance(steps, list) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return False
    taken = [range(n) for n in shape]
    for ax, start, end, step in zip(axes, starts, ends, steps, strict=True):
        d = int(ax) % len(shape)
        taken[d] = range(shape[d])[slice(int(start), int(end), int(step))]
    want = [
        range(shape[d] - length, shape[d]) if d == axis else range(n) for d, n in enumerate(shape)
    ]
    return taken == want


def window_host(window: Window, variables: dict[int, np.ndarray]) -> np.ndarray | None:
    """The buffer whose head is the window's variable (writable_copies made it so), else
    None."""
    head = variables.get(window.variable)
    host = None if head is None else head.base
    if head is None or not isinstance(host, np.ndarray) or host.base is not None:
        return None
    expected = host[window.head(host.ndim)]
    same = head.shape == expected.shape and head.strides == expected.strides
    return host if same and head.ctypes.data == expected.ctypes.data else None
