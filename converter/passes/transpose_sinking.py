"""Transpose sinking: a Transpose moves below the elementwise ops that read it, until it
meets another Transpose, which then merges with it (noop_layout.py removes the pair when
the permutations cancel).

TensorFlow exports (tf2onnx) wrap every NCHW convolution in Transposes to and from NHWC
and apply the bias, the batch norm and the activation in NHWC between them:
Conv -> Transpose -> Add(c) -> Sub(c) -> Mul(c) -> Add(c) -> Relu -> Transpose -> Conv.
Moving the first Transpose down to the second cancels both, and the elementwise ops then
sit on the convolution's own output, where the bias and batch-norm folds find them.

The rewrites, each for a Transpose T(x) of permutation p whose output has no other reader
and is no graph output:

- f(T(x)) for a unary elementwise f becomes T(f(x));
- g(T(x), c) for a binary elementwise g and a constant c becomes T(g(x, c')), where
  c' is c (at the full rank) transposed by p's inverse, so it broadcasts the same way;
- g(T(x), T(y)), both Transposes of permutation p, becomes T(g(x, y)) (a residual Add);
- a Transpose read by Transposes is folded into each of them (it stays for its other
  readers), and one of the identity permutation is bypassed (dynamic dimensions too).

A Transpose sinks only when its chain of single-reader elementwise ops reaches a tensor
a Transpose reads (a ResNet block's output feeds the next block's convolution and its
shortcut), or when it merges with another: elsewhere moving it gains nothing. Quantized
tensors are left alone (per-axis parameters would need permuting too).
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import (
    add_constant,
    consumers,
    producers,
    replace_uses,
)
from sporenet.lite.builder import unique_name
from sporenet.lite.graph import Graph, Model, Node, Tensor
from sporenet.lite.kernels import KERNELS
from sporenet.lite.kernels.elementwise import BinaryKernel
from sporenet.lite.kernels.unary import UnaryKernel
from sporenet.lite.ops import OpCode


def _perm(node: Node, rank: int) -> list[int]:
    perm = node.attrs.get("perm")
    return [int(p) for p in perm] if isinstance(perm, list) and perm else list(range(rank))[::-1]


def _kind(node: Node) -> str | None:
    """ "unary" or "binary" for an elementwise node the rewrites handle, else None."""
    if node.op == OpCode.CAST and len(node.inputs) == 1:
        return "unary"
    cls = KERNELS.get(node.op)
    if cls is None:
        return None
    if issubclass(cls, UnaryKernel) and len(node.inputs) == 1:
        return "unary"
    if issubclass(cls, BinaryKernel) and len(node.inputs) == 2:
        return "binary"
    return None


class _Sinking:
    """The rewrites of one graph (see the module docstring)."""

    def __init__(self, model: Model, graph: Graph) -> None:
        self.model, self.graph = model, graph
        self.uses = consumers(graph)
        self.made = producers(graph)

    def plain(self, index: int) -> bool:
        """A tensor the rewrites may move: not quantized, not a graph output."""
        tensor = self.model.tensors[index]
        return tensor.quantization is None and index not in self.graph.outputs

    def only_reader(self, index: int) -> Node | None:
        readers = self.uses.get(index, [])
        if len(readers) != 1 or not self.plain(index):
            return None
        return readers[0]

    def reaches_transpose(self, transpose: Node) -> bool:
        """Whether the chain of single-reader elementwise nodes below `transpose` ends in a
        tensor a Transpose reads."""
        index, seen = transpose.outputs[0], 0
        while seen < len(self.graph.nodes):
            readers = self.uses.get(index, [])
            if not self.plain(index):
                return False
            if any(r.op == OpCode.TRANSPOSE for r in readers):
                return True
            if len(readers) != 1 or _kind(readers[0]) is None or len(readers[0].outputs) != 1:
                return False
            index, seen = readers[0].outputs[0], seen + 1
        return False

    def partner(self, node: Node, transpose: Node, rank: int) -> tuple[int, Node | None] | None:
        """For a binary `node` reading `transpose`: (position of the transposed operand,
        the other operand's Transpose of the same permutation or None for a constant);
        None when neither applies."""
        t = transpose.outputs[0]
        if node.inputs[0] == node.inputs[1]:
            return None
        k = node.inputs.index(t)
        other = node.inputs[1 - k]
        tensor = self.model.tensors[other]
        if tensor.data is not None:
            if tensor.data.ndim > rank or tensor.quantization is not None:
                return None
            return k, None
        twin = self.made.get(other)
        if (
            twin is None
            or twin.op != OpCode.TRANSPOSE
            or self.only_reader(other) is not node
            or len(self.model.tensors[twin.inputs[0]].shape) != rank
            or _perm(twin, rank) != _perm(transpose, rank)
        ):
            return None
        return k, twin

    def sink(self, transpose: Node) -> bool:
        """Move `transpose` below its reader when a rewrite applies and gains; True if so."""
        x, t = transpose.inputs[0], transpose.outputs[0]
        rank = len(self.model.tensors[x].shape)
        node = self.only_reader(t)
        if node is None or len(node.outputs) != 1 or not self.plain(x):
            return False
        kind = _kind(node)
        if kind is None or not self.plain(node.outputs[0]):
            return False
        perm = _perm(transpose, rank)
        inverse = list(np.argsort(perm))
        if kind == "unary":
            if not self.reaches_transpose(transpose):
                return False
            node.inputs = [x]
        else:
            pair = self.partner(node, transpose, rank)
            if pair is None:
                return False
            k, twin = pair
            if twin is None and not self.reaches_transpose(transpose):
                return False
            inputs = list(node.inputs)
            inputs[k] = x
            if twin is None:
                data = np.asarray(self.model.tensors[inputs[1 - k]].data)
                full = data.reshape((1,) * (rank - data.ndim) + data.shape)
                name = f"{self.model.tensors[inputs[1 - k]].name}__sunk"
                inputs[1 - k] = add_constant(self.model, name, full.transpose(inverse))
            else:
                inputs[1 - k] = twin.inputs[0]
                self.graph.nodes.remove(twin)
            node.inputs = inputs
        self._reorder(transpose, node, perm)
        return True

    def _reorder(self, transpose: Node, node: Node, perm: list[int]) -> None:
        """Give `node` a new output in the untransposed layout and make `transpose` map it
        to the node's old output, placed right after the node."""
        out = node.outputs[0]
        tensor = self.model.tensors[out]
        shape, names = [0] * len(perm), [""] * len(perm)
        for k, p in enumerate(perm):
            shape[p] = tensor.shape[k]
            if tensor.dim_names:
                names[p] = tensor.dim_names[k]
        taken = {t.name for t in self.model.tensors}
        self.model.tensors.append(
            Tensor(
                name=unique_name(f"{tensor.name}__untransposed", taken, sep="__"),
                dtype=tensor.dtype,
                shape=tuple(shape),
                dim_names=tuple(names) if tensor.dim_names else (),
            )
        )
        inner = len(self.model.tensors) - 1
        node.outputs = [inner]
        transpose.inputs, transpose.outputs = [inner], [out]
        self.graph.nodes.remove(transpose)
        self.graph.nodes.insert(self.graph.nodes.index(node) + 1, transpose)

    def fold_into_readers(self, transpose: Node) -> bool:
        """Fold a Transpose into the Transposes that read it (each then reads its input);
        it stays for its other readers."""
        x, t = transpose.inputs[0], transpose.outputs[0]
        readers = self.uses.get(t, [])
        folded = [r for r in readers if r.op == OpCode.TRANSPOSE]
        if not folded:
            return False
        rank = len(self.model.tensors[x].shape)
        first = _perm(transpose, rank)
        for reader in folded:
            second = _perm(reader, rank)
            reader.inputs = [x]
            reader.attrs = {**reader.attrs, "perm": [first[j] for j in second]}
        if len(folded) == len(readers) and t not in self.graph.outputs:
            self.graph.nodes.remove(transpose)
        return True

    def drop_identity(self, gi: int, transpose: Node) -> bool:
        """Bypass a Transpose of the identity permutation (any rank, dynamic dims too)."""
        x, t = transpose.inputs[0], transpose.outputs[0]
        rank = len(self.model.tensors[x].shape)
        if _perm(transpose, rank) != list(range(rank)):
            return False
        if t in self.graph.outputs and x in self.graph.inputs:
            return False  # the runtime needs a node to produce a graph output from an input
        replace_uses(self.model, gi, t, x)
        self.graph.nodes.remove(transpose)
        return True


def sink_transposes(model: Model) -> int:
    """Apply the rewrites above until none applies; returns how many were made."""
    changes = 0
    for gi, graph in enumerate(model.graphs):
        changed = True
        while changed:
            changed = False
            sinking = _Sinking(model, graph)
            for node in list(graph.nodes):
                if node.op != OpCode.TRANSPOSE or len(node.inputs) != 1:
                    continue
                if (
                    sinking.drop_identity(gi, node)
                    or sinking.sink(node)
                    or sinking.fold_into_readers(node)
                ):
                    changes += 1
                    changed = True
                    break
    return changes
