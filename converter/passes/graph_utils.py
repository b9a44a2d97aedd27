"""Small helpers the passes share: who consumes a tensor, rewiring uses, dropping tensors,
evaluating constant subgraphs. Nothing here knows ONNX (and nothing imports `onnx`), so
cloud export runs the same passes as the converter."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.lite.builder import unique_name
from sporenet.lite.eager import fold_node
from sporenet.lite.graph import DYNAMIC, Graph, Model, Node, Tensor
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.ops import OpCode

MATERIALIZE_LIMIT = 1024
"""Folded constants up to this many bytes are always stored; larger ones only when they are
no larger than the constants they are computed from (otherwise the node is kept)."""


def contiguous(array: np.ndarray) -> np.ndarray:
    """`array` itself when C-contiguous, else a C-contiguous copy of the same shape
    (np.ascontiguousarray would turn a 0-d array into a 1-d one)."""
    if array.flags.c_contiguous:
        return array
    return np.ascontiguousarray(array).reshape(array.shape)


def should_materialize(out_bytes: int, in_bytes: int) -> bool:
    """Whether a folded constant of `out_bytes`, computed from `in_bytes` of stored
    constants, is worth storing (rather than keeping the node for the runtime to fold)."""
    return out_bytes <= MATERIALIZE_LIMIT or out_bytes <= in_bytes


def consumers(graph: Graph) -> dict[int, list[Node]]:
    """Tensor index -> the nodes that read it (a node reading it twice is listed twice)."""
    uses: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            if i != -1:
                uses.setdefault(i, []).append(node)
    return uses


def producers(graph: Graph) -> dict[int, Node]:
    """Tensor index -> the node that writes it."""
    return {i: node for node in graph.nodes for i in node.outputs}


def replace_uses(model: Model, graph_index: int, old: int, new: int) -> None:
    """Make every reader of tensor `old` (nodes, graph outputs, signatures) read `new`."""
    graph = model.graphs[graph_index]
    for node in graph.nodes:
        node.inputs = [new if i == old else i for i in node.inputs]
    graph.outputs = [new if i == old else i for i in graph.outputs]
    for sig in model.signatures.values():
        if sig.graph == graph_index:
            sig.outputs = {name: new if i == old else i for name, i in sig.outputs.items()}


def float_attr(node: Node, name: str, default: float) -> float:
    """A node's numeric attribute as a float (the default when absent or not a number)."""
    value = node.attrs.get(name, default)
    return float(value) if isinstance(value, int | float) else default


def static_shape(model: Model, index: int) -> tuple[int, ...] | None:
    """The stored shape of a tensor when it has no dynamic dimension, else None."""
    shape = model.tensors[index].shape
    return None if DYNAMIC in shape else tuple(shape)


def compact_tensors(model: Model) -> int:
    """Drop tensors no graph references and renumber the rest; returns how many went."""
    used: set[int] = set()
    for graph in model.graphs:
        used.update(graph.inputs)
        used.update(graph.outputs)
        for node in graph.nodes:
            used.update(i for i in node.inputs if i != -1)
            used.update(node.outputs)
    if len(used) == len(model.tensors):
        return 0
    remap = {old: new for new, old in enumerate(sorted(used))}
    removed = len(model.tensors) - len(remap)
    model.tensors = [model.tensors[old] for old in sorted(used)]

    def m(i: int) -> int:
        return -1 if i == -1 else remap[i]

    for graph in model.graphs:
        graph.inputs = [m(i) for i in graph.inputs]
        graph.outputs = [m(i) for i in graph.outputs]
        for node in graph.nodes:
            node.inputs = [m(i) for i in node.inputs]
            node.outputs = [m(i) for i in node.outputs]
    for sig in model.signatures.values():
        sig.inputs = {k: m(i) for k, i in sig.inputs.items()}
        sig.outputs = {k: m(i) for k, i in sig.outputs.items()}
    return removed


def add_constant(model: Model, name: str, value: np.ndarray) -> int:
    """Append a constant tensor with a name no other tensor has; returns its index."""
    candidate = unique_name(name, {t.name for t in model.tensors}, sep="__")
    array = contiguous(np.asarray(value))
    array.flags.writeable = False
    model.tensors.append(Tensor(name=candidate, dtype=array.dtype, shape=array.shape, data=array))
    return len(model.tensors) - 1


def add_tensor(model: Model, name: str, like: int) -> int:
    """Append an activation tensor with the dtype and shape of tensor `like`."""
    candidate = unique_name(name, {t.name for t in model.tensors}, sep="__")
    ref = model.tensors[like]
    model.tensors.append(Tensor(name=candidate, dtype=ref.dtype, shape=ref.shape))
    return len(model.tensors) - 1


def static_value(
    model: Model, made: dict[int, Node], index: int, memo: dict[int, np.ndarray | None]
) -> np.ndarray | None:
    """The value of a tensor that is a constant or computed from constants only (the runtime
    folds such nodes at load time), evaluated with the runtime's kernels; else None."""
    if index in memo:
        return memo[index]
    tensor = model.tensors[index]
    if tensor.data is not None:
        return tensor.data
    node = made.get(index)
    memo[index] = None  # also guards against cycles in a malformed graph
    if node is None:
        return None
    values = [None if i == -1 else static_value(model, made, i, memo) for i in node.inputs]
    if any(v is None for i, v in zip(node.inputs, values, strict=True) if i != -1):
        return None
    specs = [
        None if v is None else TensorSpec(v.shape, v.dtype, v, model.tensors[i].quantization)
        for i, v in zip(node.inputs, values, strict=True)
    ]
    outs = fold_node(model, node, specs)
    for i, value in zip(node.outputs, outs or (), strict=False):
        memo[i] = value
    return memo[index]


def fuse_self_gated(
    model: Model,
    gate_op: OpCode,
    fused_op: OpCode,
    accepts: Callable[[Node, int], bool] = lambda gate, x: True,
) -> int:
    """Rewrite every x * Gate(x) (either operand order) as Fused(x): a Mul of x and a
    `gate_op` node reading x, where the gate's output has no other reader, is no graph
    output, carries no fused activation and `accepts(gate, x)`. SiLU is x * Sigmoid(x),
    HardSwish x * HardSigmoid(x). Returns the count."""
    fused = 0
    for graph in model.graphs:
        uses, made = consumers(graph), producers(graph)
        for mul in list(graph.nodes):
            if mul.op != OpCode.MUL or len(mul.inputs) != 2 or "activation" in mul.attrs:
                continue
            a, b = mul.inputs
            for gate_index, x in ((b, a), (a, b)):
                gate = made.get(gate_index)
                if (
                    gate is None
                    or gate.op != gate_op
                    or gate.inputs != [x]
                    or "activation" in gate.attrs
                    or len(uses.get(gate_index, [])) != 1
                    or gate_index in graph.outputs
                    or not accepts(gate, x)
                ):
                    continue
                position = graph.nodes.index(mul)
                graph.nodes[position] = Node(fused_op, [x], list(mul.outputs), name=mul.name)
                graph.nodes.remove(gate)
                fused += 1
                break
    return fused
