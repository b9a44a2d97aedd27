"""Streaming states stored in their concatenation's buffer.

A streaming model (a keyword spotter fed frame by frame) keeps a variable that is read
only into the head of a CONCAT with the new frame and written back by an ASSIGN of that
CONCAT's tail. Stored as the head of the CONCAT's own buffer, the concat copies nothing
for it and the ASSIGN becomes one move inside the buffer, run after the buffer's last
reader; a graph input joined to it (the frame) is stored in that buffer too. This
module finds such windows (stream_windows), and places them in a plan (plan_windows,
frames_in_windows, shift_views, StepOrder); lite/variables.py gives them their buffers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.kernels.base import Kernel, TensorSpec
from sporenet.lite.kernels.reshape import ViewKernel
from sporenet.lite.ops import OpCode

Compute = Callable[[], None]


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


def plan_windows(
    model: Model,
    graph_index: int,
    kernels: list[Kernel | None],
    specs: dict[int, TensorSpec],
    variables: dict[int, np.ndarray],
    last_use: dict[int, int],
    exclude: Collection[int],
) -> tuple[dict[int, np.ndarray], dict[int, tuple[np.ndarray, np.ndarray]], dict[int, int]]:
    """The graph's streaming states stored in their concatenation (Window),
    except for concatenations in `exclude` (graph outputs, channels-last tensors):
    {concat output: its buffer}, {ASSIGN node: the head and the tail it copies} and
    {ASSIGN node: the node after which it runs}: the last reader of the concatenation,
    whose head the shift overwrites."""
    hosts: dict[int, np.ndarray] = {}
    shifts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    deferred: dict[int, int] = {}
    for window in stream_windows(model, graph_index):
        host = window_host(window, variables)
        spec = specs.get(window.joined)
        if host is None or spec is None or kernels[window.assign] is None:
            continue
        if window.joined in exclude or spec.value is not None:
            continue
        if spec.shape != host.shape or spec.dtype != host.dtype:
            continue
        hosts[window.joined] = host
        shifts[window.assign] = shift_views(host, window)
        end = last_use.get(window.joined, window.assign)
        if end > window.assign:
            deferred[window.assign] = end
    return hosts, shifts, deferred


def frames_in_windows(
    nodes: list[Node],
    kernels: list[Kernel | None],
    hosts: dict[int, np.ndarray],
    inputs: Collection[int],
    specs: dict[int, TensorSpec],
) -> dict[int, np.ndarray]:
    """Graph inputs that a streaming state's CONCAT joins to it (a keyword spotter's new
    frame, directly or through reshaping views), stored as their region of that
    concatenation's buffer (plan_windows' hosts): setting the input writes the frame
    where the concat would copy it, and the concat has nothing left to do. The ASSIGN's
    shift writes only the head, never a frame's region. {input: its region}; an input
    the concat requantizes keeps its own array."""
    source: dict[int, int] = {}  # a view's tensor: the tensor it reshapes
    for node, kernel in zip(nodes, kernels, strict=True):
        if isinstance(kernel, ViewKernel):
            source[node.outputs[0]] = node.inputs[0]
    frames: dict[int, np.ndarray] = {}
    for node, kernel in zip(nodes, kernels, strict=True):
        if kernel is None or node.op != OpCode.CONCAT or node.outputs[0] not in hosts:
            continue
        host = hosts[node.outputs[0]]
        for k, i in enumerate(node.inputs):
            root = i
            while root in source:
                root = source[root]
            region = kernel.output_region(k) if k and root in inputs else None
            if region is None or root in frames or specs[root].dtype != host.dtype:
                continue
            view = host[region]
            if view.size == specs[root].size and view.flags.c_contiguous:
                frames[root] = view.reshape(specs[root].shape)
    return frames


class StepOrder:
    """Appends the plan's steps in node order, except the steps deferred to run right
    after a later node (a streaming state's shift, after its buffer's last reader)."""

    def __init__(self, deferred: dict[int, int]) -> None:
        self.steps: list[Compute] = []
        self.kernels: list[Kernel] = []
        self.deferred = deferred
        self.held: dict[int, list[tuple[Compute, Kernel]]] = {}

    def add(self, j: int, step: Compute, kernel: Kernel) -> None:
        later = self.deferred.get(j)
        if later is not None:
            self.held.setdefault(later, []).append((step, kernel))
        else:
            self.steps.append(step)
            self.kernels.append(kernel)

    def reached(self, j: int) -> None:
        """Node `j` is bound: the steps deferred to after it follow."""
        for step, kernel in self.held.pop(j, ()):
            self.steps.append(step)
            self.kernels.append(kernel)


def shift_views(host: np.ndarray, window: Window) -> tuple[np.ndarray, np.ndarray]:
    """The ASSIGN's target and value in `host`: its head and its tail, as 1-D views of the
    widest word that divides them when both are runs of the buffer's memory (an
    overlapping copy of 1-D views is one move; of N-D views NumPy buffers it)."""
    head, tail = host[window.head(host.ndim)], host[window.tail(host.shape)]
    if not host.flags.c_contiguous or int(np.prod(host.shape[: window.axis])) != 1:
        return head, tail
    flat = host.reshape(-1).view(np.uint8)
    start, size = tail.ctypes.data - host.ctypes.data, head.nbytes
    width = next(w for w in (8, 4, 2, 1) if (start | size | host.ctypes.data) % w == 0)
    return flat[:size].view(f"u{width}"), flat[start : start + size].view(f"u{width}")
