"""Structured channel pruning: remove whole output channels, so the model is smaller and
faster on any runtime (unstructured zeros only shrink the file).

It works on the IR graph, not on cloud modules: a model exported by `cloud` (BatchNorm
already folded), one imported by the converter and the benchmark's hand-built nets all
take the same path, and the graph shows every consumer of a channel whatever Python code
produced it. Channels are tracked through the graph as "channel spaces" (a union-find
over tensors): a Conv2D or FullyConnected output opens a new space; ops that keep
channels in place (activations, pooling, BatchNorm, depthwise convolution) and
elementwise ops between activations (a residual Add) join their inputs' and output's
spaces, so a residual group keeps one channel set; Concat along channels and Flatten
give derived spaces that map back to their inputs'. A space read by anything else (a
Reshape, a graph output, a broadcast constant) is fixed and keeps all its channels.

In each prunable space the channels with the smallest score (the L1 norm of their
producers' filters plus |bias|, summed over the residual group) are removed: producers
lose those filters and biases, BatchNorms and depthwise convolutions their entries, and
every consumer the matching input slices of its weights.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sporenet.cloud._checks import number
from sporenet.cloud.errors import ConfigError
from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import Channels, derived_set

CHANNELWISE = derived_set(lambda d: d.channels == Channels.PASS)
"""Ops whose output channel c depends only on input channel c (a space passes through)."""
ELEMENTWISE = derived_set(lambda d: d.channels == Channels.ELEMENTWISE)
"""Binary ops combining channel c of each operand."""


@dataclass
class _Derived:
    """A tensor whose channels come from other spaces: a channel concat or a flatten."""

    parts: list[int]  # source tensors, in order
    repeat: int = 1  # flatten: each source channel spans `repeat` features


@dataclass
class _Analysis:
    """Channel spaces of one graph."""

    parent: dict[int, int] = field(default_factory=dict)
    fixed: set[int] = field(default_factory=set)
    derived: dict[int, _Derived] = field(default_factory=dict)
    producers: list[Node] = field(default_factory=list)  # conv/FC whose output is a space
    consumers: list[Node] = field(default_factory=list)  # conv/FC slicing their input
    channelwise: list[Node] = field(default_factory=list)  # BatchNorm, depthwise conv

    def find(self, t: int) -> int:
        root = t
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        self.parent[t] = root
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            if rb in self.fixed:
                self.fixed.add(ra)

    def fix(self, t: int) -> None:
        if t in self.derived:
            for part in self.derived[t].parts:
                self.fix(part)
        else:
            self.fixed.add(self.find(t))

    def pass_through(self, x: int, out: int) -> None:
        """`out` has the channels of `x` (same space, or the same derivation)."""
        if x in self.derived:
            self.derived[out] = self.derived[x]
        else:
            self.parent[out] = out
            self.union(x, out)

    def tracked(self, t: int) -> bool:
        return t in self.derived or t in self.parent

    def fix_all(self, tensors: Sequence[int]) -> None:
        """Fix the tracked ones among `tensors`: their channels are read as a whole."""
        for t in tensors:
            if self.tracked(t):
                self.fix(t)

    def open_fixed(self, t: int) -> None:
        """`t` starts a space of its own that keeps all its channels."""
        self.parent[t] = t
        self.fixed.add(t)


def _int_attr(node: Node, name: str, default: int) -> int:
    """An integer attribute of `node` (the default when absent)."""
    value = node.attrs.get(name, default)
    if not isinstance(value, int):
        raise ConfigError(
            f"{node.op.name} node {node.name!r}: `{name}` must be an int, got {value!r}"
        )
    return value


def _constant(model: Model, index: int) -> np.ndarray:
    """The stored value of a weight the analysis found constant."""
    data = model.tensors[index].data
    if data is None:
        raise ConfigError(f"tensor {model.tensors[index].name!r} is not a constant")
    return data


def _channels_axis(model: Model, t: int, axis: int) -> bool:
    rank = len(model.tensors[t].shape)
    return axis % max(rank, 1) == 1


def _analyse(model: Model, graph_index: int) -> _Analysis:
    graph = model.graphs[graph_index]
    a = _Analysis()
    for i in graph.inputs:
        a.open_fixed(i)
    for node in graph.nodes:
        step = _Step(model, node)
        if not any(rule(a, step) for rule in _RULES):
            # Anything else reads its inputs' channels in ways we do not follow.
            a.fix_all(step.acts)
            for o in node.outputs:
                a.open_fixed(o)
    a.fix_all(graph.outputs)
    return a


@dataclass(frozen=True)
class _Step:
    """One node as the analysis sees it: its activation inputs and its output."""

    model: Model
    node: Node

    def const(self, i: int) -> bool:
        return i != -1 and self.model.tensors[i].data is not None

    @property
    def acts(self) -> list[int]:
        return [i for i in self.node.inputs if i != -1 and not self.const(i)]

    @property
    def out(self) -> int:
        return self.node.outputs[0] if self.node.outputs else -1


def _weighted(a: _Analysis, s: _Step) -> bool:
    """Conv2D / FullyConnected with constant weights: its output opens a new space; a
    grouped conv fixes its input (a depthwise one passes its input's space through)."""
    node, out = s.node, s.out
    if node.op not in (OpCode.CONV2D, OpCode.FULLY_CONNECTED) or len(node.inputs) < 2:
        return False
    w = s.model.tensors[node.inputs[1]].data if node.inputs[1] != -1 else None
    if w is None:
        return False
    group = _int_attr(node, "group", 1)
    x = node.inputs[0]
    if node.op == OpCode.CONV2D and group > 1:
        if group == w.shape[0] and w.shape[1] == 1 and a.tracked(x):  # depthwise
            a.pass_through(x, out)
            a.channelwise.append(node)
            return True
        a.fix_all(s.acts)
        a.open_fixed(out)
        return True
    if a.tracked(x):
        a.consumers.append(node)
    bias = node.inputs[2] if len(node.inputs) > 2 else -1
    if bias != -1 and not s.const(bias):
        a.open_fixed(out)  # a computed bias cannot be sliced: the output keeps its channels
        return True
    a.parent[out] = out
    a.producers.append(node)
    return True


def _channelwise(a: _Analysis, s: _Step) -> bool:
    """An op whose output channel c reads only input channel c: the space passes through."""
    node, acts = s.node, s.acts
    if not (node.op in CHANNELWISE and acts and a.tracked(acts[0]) and acts[0] == node.inputs[0]):
        return False
    a.pass_through(acts[0], s.out)
    if node.op == OpCode.BATCH_NORM:
        a.channelwise.append(node)
    for extra in node.outputs[1:]:
        a.open_fixed(extra)
    return True


def _elementwise(a: _Analysis, s: _Step) -> bool:
    """An elementwise op between same-shape activations (a residual Add) joins their spaces."""
    node, acts, tensors = s.node, s.acts, s.model.tensors
    if not (node.op in ELEMENTWISE and acts and all(a.tracked(i) for i in acts)):
        return False
    shapes = {tuple(tensors[i].shape) for i in acts}
    scalars = all(_constant(s.model, i).size == 1 for i in node.inputs if s.const(i))
    if len(shapes) != 1 or not scalars or any(i in a.derived for i in acts):
        return False
    a.parent[s.out] = s.out
    for i in acts:
        a.union(i, s.out)
    return True


def _concat(a: _Analysis, s: _Step) -> bool:
    """A concat of activations along channels: a space derived from its inputs'."""
    node, acts = s.node, s.acts
    if not (
        node.op == OpCode.CONCAT
        and acts == list(node.inputs)
        and all(a.tracked(i) for i in acts)
        and _channels_axis(s.model, s.out, _int_attr(node, "axis", 1))
    ):
        return False
    a.derived[s.out] = _Derived(parts=list(acts))
    return True


def _flatten(a: _Analysis, s: _Step) -> bool:
    """Flatten after the channel axis: each channel spans the spatial features."""
    node, acts = s.node, s.acts
    if not (
        node.op == OpCode.FLATTEN
        and acts
        and a.tracked(acts[0])
        and _int_attr(node, "axis", 1) == 1
        and acts[0] not in a.derived
    ):
        return False
    shape = s.model.tensors[acts[0]].shape
    if len(shape) < 2 or not all(d > 0 for d in shape[2:]):
        return False
    a.derived[s.out] = _Derived(parts=[acts[0]], repeat=int(np.prod(shape[2:], dtype=np.int64)))
    return True


# How channels flow through a node, tried in order; a node no rule takes fixes its inputs.
_RULES = (_weighted, _channelwise, _elementwise, _concat, _flatten)


def _scores(model: Model, a: _Analysis) -> dict[int, np.ndarray]:
    """Per prunable space: each channel's L1 norm over its producers' filters and biases."""
    scores: dict[int, np.ndarray] = {}
    for node in a.producers:
        root = a.find(node.outputs[0])
        if root in a.fixed:
            continue
        w = _constant(model, node.inputs[1])
        s = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1).sum(axis=1)
        if len(node.inputs) > 2 and node.inputs[2] != -1:
            s = s + np.abs(_constant(model, node.inputs[2]).astype(np.float64))
        scores[root] = scores[root] + s if root in scores else s
    return scores


def prune_channels(
    model: Model, ratio: float, *, graph_index: int = 0, min_channels: int = 1
) -> Model:
    """A copy of `model` with `ratio` of the output channels of every prunable channel
    space removed (see the module docstring); the input model is not changed.

    Args:
        model: a lite Model (cloud.to_inference_ir output, a converted or loaded model).
        ratio: fraction of each space's channels to remove, in [0, 1).
        graph_index: the graph to prune.
        min_channels: channels a space keeps at least.
    Returns:
        The pruned Model, with shapes inferred again.
    Raises:
        ConfigError: a bad ratio or min_channels.
    """
    number("ratio", ratio, low=0.0, high=1.0, high_open=True)
    if min_channels < 1:
        raise ConfigError(f"`min_channels` must be >= 1, got {min_channels}")
    model = copy.deepcopy(model)
    a = _analyse(model, graph_index)
    keep: dict[int, np.ndarray] = {}
    for root, s in _scores(model, a).items():
        n = max(min_channels, s.size - round(ratio * s.size))
        keep[root] = np.sort(np.argsort(s, kind="stable")[::-1][:n])
    _slice_weights(model, a, keep)
    fill_inferred_shapes(model, graph_index)
    return model


def _kept(model: Model, a: _Analysis, keep: dict[int, np.ndarray], t: int) -> np.ndarray | None:
    """Input channels of tensor t that survive (None: all of them)."""
    if t not in a.derived:
        return keep.get(a.find(t))
    d = a.derived[t]
    pieces, offset, changed = [], 0, False
    for part in d.parts:
        size = model.tensors[part].shape[1]
        sub = _kept(model, a, keep, part)
        changed |= sub is not None
        pieces.append((np.arange(size) if sub is None else sub) + offset)
        offset += size
    if not changed:
        return None
    idx = np.concatenate(pieces)
    if d.repeat > 1:
        idx = (idx[:, None] * d.repeat + np.arange(d.repeat)).reshape(-1)
    return idx


def _slice_weights(model: Model, a: _Analysis, keep: dict[int, np.ndarray]) -> None:
    """Cut the removed channels out of every producer, consumer and channel-wise node."""
    tensors = model.tensors

    def slice_const(i: int, idx: np.ndarray, axis: int) -> None:
        if i == -1:
            return
        data = np.ascontiguousarray(np.take(_constant(model, i), idx, axis=axis))
        tensors[i] = dataclasses.replace(tensors[i], data=data, shape=tuple(data.shape))

    # Consumers first: they read the original input sizes.
    for node in a.consumers:
        idx = _kept(model, a, keep, node.inputs[0])
        if idx is not None:
            slice_const(node.inputs[1], idx, 1)
    for node in a.producers:
        idx = keep.get(a.find(node.outputs[0]))
        if idx is not None:
            slice_const(node.inputs[1], idx, 0)
            if len(node.inputs) > 2:
                slice_const(node.inputs[2], idx, 0)
    for node in a.channelwise:
        idx = _kept(model, a, keep, node.inputs[0])
        if idx is None:
            continue
        if node.op == OpCode.BATCH_NORM:
            for i in node.inputs[1:5]:
                slice_const(i, idx, 0)
        else:  # depthwise convolution
            slice_const(node.inputs[1], idx, 0)
            if len(node.inputs) > 2:
                slice_const(node.inputs[2], idx, 0)
            node.attrs["group"] = int(idx.size)


def channel_counts(model: Model, graph_index: int = 0) -> dict[str, int]:
    """Output channels of every Conv2D and FullyConnected node by node name."""
    return {
        n.name: int(model.tensors[n.inputs[1]].shape[0])
        for n in model.graphs[graph_index].nodes
        if n.op in (OpCode.CONV2D, OpCode.FULLY_CONNECTED)
    }
