"""Mixed depthwise convolution (MixConv) as one depthwise layer.

A MixConv block splits its channels into groups, runs a depthwise convolution with a
kernel size of its own on each (over a window of the same input: the streaming keyword
spotters of micro_wakeword slice each group's most recent frames), and concatenates
the results along the channels:

    Split(x) -> [Slice] -> Transpose -> depthwise Conv2D (k_i) -> ... -> Concat

Each group's filter reads taps [s_i, s_i + k_i) of the window its slice starts at s_i,
so one depthwise layer over the unsliced input with kernel K = max(s_i + k_i), each
channel's filter placed at its group's taps and zero elsewhere, computes the same
outputs: every zero tap adds an exact zero (an int8 weight equal to its zero point),
so int8 results are identical, float ones equal up to the order of the sums. The
block's split, slices, group convolutions and concatenation become one transpose and
one convolution: on a streaming step, where each step's call costs more than its
arithmetic, most of the block's time.

Recognized when every group's convolution is depthwise with the same stride (1),
dilation, zero padding, activation and input, all outputs have one spatial size, the
slices cut only the spatial axes with step 1, every intermediate has the chain as its
only reader, and for int8 the groups' outputs share the concatenation's quantization
(so it only copies). Anything else stays as it was.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from sporenet.converter.passes.graph_utils import add_constant, add_tensor, consumers
from sporenet.lite.graph import Graph, Model, Node, Quantization
from sporenet.lite.ops import OpCode


def merge_mixconv(model: Model) -> int:
    """Rewrite every MixConv block as one depthwise convolution; returns the count."""
    merged = 0
    for graph in model.graphs:
        for split in [n for n in graph.nodes if n.op == OpCode.SPLIT]:
            block = _match(model, graph, split)
            if block is not None:
                _rewrite(model, graph, block)
                merged += 1
    return merged


@dataclasses.dataclass
class _Group:
    """One channel group: its nodes (slice or None, transpose, conv) and its window."""

    nodes: list[Node]
    conv: Node
    start: tuple[int, int]  # first input row and column its slice keeps
    kernel: tuple[int, int]


@dataclasses.dataclass
class _Block:
    split: Node
    groups: list[_Group]
    concat: Node
    perm: list[int]
    bias: tuple[np.ndarray, Quantization | None] | None


def _only_reader(graph: Graph, uses: dict[int, list[Node]], index: int) -> Node | None:
    readers = uses.get(index, [])
    return readers[0] if len(readers) == 1 and index not in graph.outputs else None


def _ints(value: object) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _slice_starts(model: Model, node: Node, axis: int) -> list[int] | None:
    """Per axis, the first index a step-1 Slice (attributes only) keeps, or None when it
    cuts the split axis, steps or is given by inputs."""
    shape = model.tensors[node.inputs[0]].shape
    starts, ends = _ints(node.attrs.get("starts")), _ints(node.attrs.get("ends"))
    axes = _ints(node.attrs.get("axes")) or list(range(len(starts or [])))
    steps = _ints(node.attrs.get("steps")) or [1] * len(axes)
    if len(node.inputs) != 1 or starts is None or ends is None or min(shape, default=0) < 0:
        return None
    first = [0] * len(shape)
    for a, s, e, step in zip(axes, starts, ends, steps, strict=False):
        a %= len(shape)
        dim = shape[a]
        s, e = min(max(s + dim if s < 0 else s, 0), dim), min(max(e + dim if e < 0 else e, 0), dim)
        if step != 1 or (a == axis and (s, e) != (0, dim)):
            return None
        first[a] = s
    return first


def _group(
    model: Model, graph: Graph, uses: dict[int, list[Node]], part: int, axis: int
) -> tuple[_Group, list[int]] | None:
    """The group reading split output `part` and its transpose's permutation, or None."""
    node = _only_reader(graph, uses, part)
    nodes: list[Node] = []
    starts = [0] * len(model.tensors[part].shape)
    if node is not None and node.op == OpCode.SLICE:
        found = _slice_starts(model, node, axis)
        if found is None:
            return None
        starts, nodes = found, [node]
        node = _only_reader(graph, uses, node.outputs[0])
    if node is None or node.op != OpCode.TRANSPOSE:
        return None
    perm = _ints(node.attrs.get("perm"))
    conv = _only_reader(graph, uses, node.outputs[0])
    if perm is None or len(perm) != 4 or perm[1] != axis or conv is None:
        return None
    if conv.op != OpCode.CONV2D or conv.inputs[0] != node.outputs[0] or len(conv.inputs) < 2:
        return None
    w = model.tensors[conv.inputs[1]]
    channels = model.tensors[part].shape[axis]
    if w.data is None or w.shape[:2] != (channels, 1) or conv.attrs.get("group") != channels:
        return None
    start = (starts[perm[2]], starts[perm[3]])
    return _Group([*nodes, node, conv], conv, start, (w.shape[2], w.shape[3])), perm


_SHARED = ("strides", "dilations", "activation", "rounding")


def _match(model: Model, graph: Graph, split: Node) -> _Block | None:
    uses = consumers(graph)
    x = split.inputs[0]
    shape, quant = model.tensors[x].shape, model.tensors[x].quantization
    axis = split.attrs.get("axis", 0)
    if len(shape) != 4 or len(split.outputs) < 2 or min(shape) < 0 or not isinstance(axis, int):
        return None
    if quant is not None and quant.scale.size != 1:
        return None  # per-axis parameters would need their axis moved by the transpose
    axis %= 4
    groups, perms = [], []
    for part in split.outputs:
        found = _group(model, graph, uses, part, axis)
        if found is None:
            return None
        groups.append(found[0])
        perms.append(found[1])
    concat = _only_reader(graph, uses, groups[0].conv.outputs[0])
    outs = [g.conv.outputs[0] for g in groups]
    if concat is None or concat.op != OpCode.CONCAT or concat.inputs != outs:
        return None
    concat_axis = concat.attrs.get("axis", 0)
    if not isinstance(concat_axis, int) or concat_axis % 4 != 1:
        return None
    if any(p != perms[0] for p in perms):
        return None
    if any(_only_reader(graph, uses, o) is not concat for o in outs):
        return None
    if not _compatible(model, groups, concat) or not _windows_fit(model, x, perms[0], groups):
        return None
    ok, bias = _block_bias(model, groups)
    if not ok:
        return None
    return _Block(split, groups, concat, perms[0], bias)


def _compatible(model: Model, groups: Sequence[_Group], concat: Node) -> bool:
    """Whether the groups' convolutions share their attributes (stride 1, no padding)
    and their outputs the concatenation's dtype and quantization."""
    first = groups[0].conv
    for g in groups:
        attrs = g.conv.attrs
        if any(attrs.get(k) != first.attrs.get(k) for k in _SHARED):
            return False
        if any(_ints(attrs.get("pads")) or [0]) or len(g.conv.inputs) != len(first.inputs):
            return False
        if (_ints(attrs.get("strides")) or [1, 1]) != [1, 1]:
            return False
        if not _same_quant(model, g.conv.outputs[0], concat.outputs[0]):
            return False
    return True


def _block_bias(
    model: Model, groups: Sequence[_Group]
) -> tuple[bool, tuple[np.ndarray, Quantization | None] | None]:
    """(whether the biases merge, the merged bias or None when no group has one): they
    do not when only some groups have one or one is not a constant."""
    present = [len(g.conv.inputs) > 2 and g.conv.inputs[2] != -1 for g in groups]
    if not any(present):
        return True, None
    merged = _merged_bias(model, groups) if all(present) else None
    return merged is not None, merged


def _same_quant(model: Model, a: int, b: int) -> bool:
    qa, qb = model.tensors[a].quantization, model.tensors[b].quantization
    if qa is None or qb is None:
        return qa is None and qb is None and model.tensors[a].dtype == model.tensors[b].dtype
    return (
        model.tensors[a].dtype == model.tensors[b].dtype
        and np.array_equal(qa.scale, qb.scale)
        and np.array_equal(qa.zero_point, qb.zero_point)
    )


def _merged_kernel(groups: Sequence[_Group]) -> tuple[int, int]:
    return (
        max(g.start[0] + g.kernel[0] for g in groups),
        max(g.start[1] + g.kernel[1] for g in groups),
    )


def _windows_fit(model: Model, x: int, perm: list[int], groups: Sequence[_Group]) -> bool:
    """Whether the merged kernel over the unsliced input gives every group's output
    size (stride 1; the dilation must be 1 where a group's window is offset)."""
    shape = model.tensors[x].shape
    rows, cols = shape[perm[2]], shape[perm[3]]
    kh, kw = _merged_kernel(groups)
    dilations = _ints(groups[0].conv.attrs.get("dilations")) or [1, 1]
    if dilations != [1, 1]:
        return False
    size = (rows - kh + 1, cols - kw + 1)
    return all(tuple(model.tensors[g.conv.outputs[0]].shape[2:]) == size for g in groups)


def _merged_weights(
    model: Model, groups: Sequence[_Group]
) -> tuple[np.ndarray, Quantization | None]:
    """The (C, 1, KH, KW) filters with each group's taps at its window, zero (the zero
    point) elsewhere, and their per-channel quantization for int8 weights."""
    kh, kw = _merged_kernel(groups)
    parts, scales, zeros = [], [], []
    for g in groups:
        w = model.tensors[g.conv.inputs[1]]
        data = np.asarray(w.data)
        c = data.shape[0]
        q = w.quantization
        zp = np.zeros(c, np.int64) if q is None else np.broadcast_to(q.zero_point, (c,))
        block = np.empty((c, 1, kh, kw), data.dtype)
        block[...] = zp.reshape(c, 1, 1, 1).astype(data.dtype)
        r, s = g.start
        block[:, :, r : r + g.kernel[0], s : s + g.kernel[1]] = data
        parts.append(block)
        if q is not None:
            scales.append(np.broadcast_to(q.scale, (c,)))
            zeros.append(zp)
    merged = np.concatenate(parts)
    quant = None
    if scales:
        quant = Quantization(
            scale=np.concatenate(scales).astype(np.float32),
            zero_point=np.concatenate(zeros).astype(np.int64),
            axis=0,
        )
    return merged, quant


def _merged_bias(
    model: Model, groups: Sequence[_Group]
) -> tuple[np.ndarray, Quantization | None] | None:
    """The groups' constant biases end to end (with their per-channel parameters), or
    None when one is not a constant."""
    values, scales, zeros = [], [], []
    for g in groups:
        bias = model.tensors[g.conv.inputs[2]]
        if bias.data is None:
            return None
        n = bias.data.size
        values.append(np.asarray(bias.data).reshape(-1))
        if bias.quantization is not None:
            scales.append(np.broadcast_to(bias.quantization.scale, (n,)))
            zeros.append(np.broadcast_to(bias.quantization.zero_point, (n,)))
    value = np.concatenate(values)
    if not scales:
        return value, None
    if len(scales) != len(values):
        return None
    scale, zero = np.concatenate(scales), np.concatenate(zeros)
    return value, Quantization(scale=scale.astype(np.float32), zero_point=zero.astype(np.int64))


def _constant(model: Model, name: str, value: np.ndarray, quant: Quantization | None) -> int:
    index = add_constant(model, name, value)
    if quant is not None:
        model.tensors[index] = dataclasses.replace(model.tensors[index], quantization=quant)
    return index


def _rewrite(model: Model, graph: Graph, block: _Block) -> None:
    x = block.split.inputs[0]
    first = block.groups[0].conv
    name = block.concat.name or first.name
    moved = add_tensor(model, f"{name}/mixconv_input", x)
    shape = model.tensors[x].shape
    model.tensors[moved] = dataclasses.replace(
        model.tensors[moved],
        shape=tuple(shape[p] for p in block.perm),
        quantization=model.tensors[x].quantization,
    )
    weights, wq = _merged_weights(model, block.groups)
    inputs = [moved, _constant(model, f"{name}/mixconv_weights", weights, wq)]
    if block.bias is not None:
        inputs.append(_constant(model, f"{name}/mixconv_bias", *block.bias))
    attrs = dict(first.attrs)
    attrs["group"] = int(weights.shape[0])
    transpose = Node(
        OpCode.TRANSPOSE, [x], [moved], name=f"{name}/mixconv_transpose", attrs={"perm": block.perm}
    )
    conv = Node(
        OpCode.CONV2D,
        inputs,
        list(block.concat.outputs),
        name=name,
        attrs=attrs,
        version=first.version,
    )
    position = graph.nodes.index(block.split)
    gone = {id(block.split), id(block.concat), *(id(n) for g in block.groups for n in g.nodes)}
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    graph.nodes[position:position] = [transpose, conv]
