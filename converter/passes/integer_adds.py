"""Integer bias additions of dynamically quantized graphs, done in float.

onnxruntime's quantize_dynamic writes a quantized Conv or MatMul with a bias as
ConvInteger -> Add(int32 bias) -> Cast(float) -> Mul(scale), the bias quantized at run
time (Floor(bias / scale) cast to int32). The importer emulates ConvInteger in float and
rounds its integer-valued result before the int32 cast (Floor(y + 0.5),
onnx_import/ops/quantized.py). The int32 round trip around the Add adds nothing: a
float32 sum of two float32 integers is their int32 sum rounded to float32. So

    Cast(Cast(Floor(y + 0.5), int32) + Reshape(Cast(Floor(q), int32)), float32)
        == Floor(y + (Reshape(Floor(q)) + 0.5))

(exactly while |y + bias| < 2^22, the range the importer's rounding already assumes),
and three passes over the activation (the int32 cast, the integer Add, the float cast)
become one small per-channel Add. Without the integer bias (newer quantize_dynamic adds
it in float after the scaling), Cast(Cast(Floor(y + 0.5), int32), float32) is
Floor(y + 0.5). Only chains that start at the importer's rounding Add(y, 0.5) fold: their
values are finite integers inside int32's range, where the casts change nothing.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.passes.graph_utils import add_tensor, consumers, producers, replace_uses
from sporenet.lite.graph import Graph, Model, Node
from sporenet.lite.ops import OpCode

_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)


def _half(model: Model, index: int) -> bool:
    """Whether tensor `index` is a constant holding the one number 0.5."""
    data = model.tensors[index].data
    return data is not None and data.size == 1 and data.dtype == _FLOAT32 and data.item() == 0.5


class _Lookup:
    """Producers and readers of one graph's tensors, and the chain's building blocks."""

    def __init__(self, model: Model, graph: Graph) -> None:
        self.model, self.graph = model, graph
        self.uses, self.made = consumers(graph), producers(graph)

    def single(self, index: int, op: OpCode) -> Node | None:
        """The producer of `index` if it is an `op` node read only once, else None."""
        node = self.made.get(index)
        if (
            node is None
            or node.op != op
            or len(self.uses.get(index, [])) != 1
            or index in self.graph.outputs
            or "activation" in node.attrs
        ):
            return None
        return node

    def cast_of_floor(self, index: int) -> tuple[Node, Node] | None:
        """(Cast to int32, Floor) when `index` is Cast(Floor(...), int32)."""
        cast = self.single(index, OpCode.CAST)
        if cast is None or self.model.tensors[index].dtype != _INT32:
            return None
        floor = self.single(cast.inputs[0], OpCode.FLOOR)
        if floor is None or self.model.tensors[cast.inputs[0]].dtype != _FLOAT32:
            return None
        return cast, floor

    def rounding(self, floor: Node) -> Node | None:
        """The importer's Add(y, 0.5) before `floor`: the chain rounds an integer product
        emulated in float (finite, well inside int32's range), nothing else."""
        shift = self.single(floor.inputs[0], OpCode.ADD)
        if shift is None or len(shift.inputs) != 2 or not _half(self.model, shift.inputs[1]):
            return None
        return shift

    def bias(self, index: int) -> tuple[Node | None, Node] | None:
        """(Reshape or None, Cast to int32) when `index` is [Reshape](Cast(Floor(q), int32))."""
        reshape = self.made.get(index)
        if reshape is None or reshape.op != OpCode.RESHAPE or len(reshape.inputs) != 1:
            found = self.cast_of_floor(index)
            return None if found is None else (None, found[0])
        if len(self.uses.get(index, [])) != 1 or index in self.graph.outputs:
            return None
        found = self.cast_of_floor(reshape.inputs[0])
        return None if found is None else (reshape, found[0])


def _fold_round_trip(look: _Lookup, gi: int, last: Node) -> bool:
    """Cast(Cast(Floor(y + 0.5), int32), float32) -> Floor(y + 0.5)."""
    found = look.cast_of_floor(last.inputs[0])
    if found is None or look.rounding(found[1]) is None:
        return False
    cast, floor = found
    look.graph.nodes.remove(last)
    look.graph.nodes.remove(cast)
    replace_uses(look.model, gi, last.outputs[0], floor.outputs[0])
    return True


def _fold_bias_add(look: _Lookup, gi: int, last: Node) -> bool:
    """Cast(Cast(Floor(y + 0.5), int32) + [Reshape](Cast(Floor(q), int32)), float32) ->
    Floor(y + ([Reshape](Floor(q)) + 0.5))."""
    model, graph = look.model, look.graph
    add = look.single(last.inputs[0], OpCode.ADD)
    if add is None or len(add.inputs) != 2 or model.tensors[add.outputs[0]].dtype != _INT32:
        return False
    for value, bias in (add.inputs, add.inputs[::-1]):
        rounded, quantized = look.cast_of_floor(value), look.bias(bias)
        if rounded is None or quantized is None:
            continue
        shift = look.rounding(rounded[1])
        reshape, bias_cast = quantized
        bias_float = bias_cast.inputs[0]
        source = look.made.get(bias_float)
        if shift is None or (
            source is not None and graph.nodes.index(source) > graph.nodes.index(shift)
        ):
            continue  # the bias would be computed after its use: leave the graph as it is
        new: list[Node] = []
        if reshape is not None:
            reshaped = add_tensor(model, f"{reshape.name}/float", reshape.outputs[0])
            model.tensors[reshaped].dtype = _FLOAT32
            new.append(
                Node(
                    OpCode.RESHAPE, [bias_float], [reshaped], dict(reshape.attrs), name=reshape.name
                )
            )
            bias_float = reshaped
        halved = add_tensor(model, f"{shift.name}/bias", bias_float)
        new.append(
            Node(OpCode.ADD, [bias_float, shift.inputs[1]], [halved], name=f"{shift.name}/bias")
        )
        position = graph.nodes.index(shift)
        graph.nodes[position:position] = new
        shift.inputs = [shift.inputs[0], halved]
        for node in (last, add, rounded[0], bias_cast, reshape):
            if node is not None:
                graph.nodes.remove(node)
        replace_uses(model, gi, last.outputs[0], rounded[1].outputs[0])
        return True
    return False


def fold_integer_adds(model: Model) -> int:
    """Rewrite every matching chain (module docstring); returns how many."""
    folded = 0
    for gi, graph in enumerate(model.graphs):
        look = _Lookup(model, graph)
        for last in list(graph.nodes):
            if last not in graph.nodes or last.op != OpCode.CAST:
                continue
            if model.tensors[last.outputs[0]].dtype != _FLOAT32:
                continue
            if _fold_round_trip(look, gi, last) or _fold_bias_add(look, gi, last):
                folded += 1
                look = _Lookup(model, graph)  # the graph changed
    return folded
