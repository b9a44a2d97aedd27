"""Which weights personalization trains: the model's head, found by walking back from its
logits.

The head is the last layer with float weights before the logits (a FullyConnected,
Conv2D or MatMul, plus a bias Add after it), reached through ops that carry no weights
(Reshape, Flatten, Squeeze, Dequantize...). Where that layer's weights are integer (an
int8 model) the runtime cannot train them in place: `float_head_copy` then rewrites the
model with a float copy of that layer (its dequantized weights, fed by the dequantized
int8 activations) whose output is the logits, and requantizes it for the int8 ops that
read the old output, so every output stays consistent. Where neither works, the head is
unavailable and the reason says so, so the app refuses personalization with a 4xx.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np

from sporenet import lite
from sporenet.lite import OpCode

LAYERS = (OpCode.FULLY_CONNECTED, OpCode.CONV2D, OpCode.MATMUL)
"""Ops whose constant inputs are a head's weights."""
PASS_THROUGH = (
    OpCode.RESHAPE,
    OpCode.FLATTEN,
    OpCode.SQUEEZE,
    OpCode.DEQUANTIZE,
    OpCode.ADD,
)
"""Ops walked through on the way back from the logits (an Add contributes its bias)."""
MAX_STEPS = 6


@dataclass(frozen=True)
class Head:
    """The head's trainable tensor names, or why there is none."""

    names: frozenset[str]
    reason: str = ""

    @property
    def available(self) -> bool:
        return bool(self.names)


def _producers(model: lite.Model, graph: lite.Graph) -> dict[int, lite.Node]:
    return {out: node for node in graph.nodes for out in node.outputs if out != -1}


def find_head(model: lite.Model, output: str) -> Head:
    """The head that produces `output` of the "infer" signature."""
    sig = model.signature("infer")
    graph = model.graphs[sig.graph]
    producers = _producers(model, graph)
    tensor = sig.outputs[output]
    names: set[str] = set()
    for _ in range(MAX_STEPS):
        node = producers.get(tensor)
        if node is None:
            break
        consts = [model.tensors[i] for i in node.inputs if i != -1 and model.tensors[i].is_constant]
        if any(t.dtype.kind in "iu" for t in consts) and node.op in LAYERS:
            return Head(
                frozenset(),
                f"the head ({node.op.name} producing {output!r}) has integer weights "
                f"({', '.join(sorted({str(t.dtype) for t in consts}))}): the runtime trains "
                "float weights only; personalize the float model and quantize it afterwards",
            )
        names |= {t.name for t in consts if t.dtype.kind == "f"}
        if node.op in LAYERS:
            if names:
                return Head(frozenset(names))
            break
        if node.op not in PASS_THROUGH:
            break
        dynamic = [i for i in node.inputs if i != -1 and not model.tensors[i].is_constant]
        if len(dynamic) != 1:
            break
        tensor = dynamic[0]
    return Head(
        frozenset(),
        f"no layer with float weights (one of {[op.name for op in LAYERS]}) produces "
        f"{output!r}: there is no head to personalize",
    )


def _dequantized(tensor: lite.Tensor) -> np.ndarray:
    """A constant int8/int32 tensor's real values (per tensor or per channel)."""
    q = tensor.quantization
    assert tensor.data is not None and q is not None  # checked by the caller
    shape = [1] * tensor.data.ndim
    if q.scale.size > 1:
        shape[q.axis] = -1
    scale = np.asarray(q.scale, np.float64).reshape(shape)
    zero = np.asarray(q.zero_point, np.float64).reshape(shape) if q.zero_point.size else 0.0
    return ((tensor.data.astype(np.float64) - zero) * scale).astype(np.float32)


def float_head_copy(model: lite.Model, output: str) -> tuple[lite.Model, Head]:
    """`model` with a float copy of its int8 head producing `output`, and that head.

    Handles a head that is a FullyConnected with quantized weights whose int8 output
    reaches `output` through one Dequantize; returns (model, an unavailable Head with the
    reason) for anything else.
    """
    head = _Int8Head.find(model, output)
    if head is None:
        return model, find_head(model, output)
    out = copy.deepcopy(model)
    floats = _FloatHead.add(out, head, output)
    _splice(out, head, floats, output)
    lite.validate(out)
    names = {out.tensors[floats.w].name, *([out.tensors[floats.b].name] if floats.b != -1 else [])}
    return out, Head(frozenset(names))


@dataclass(frozen=True)
class _Int8Head:
    """A quantized FullyConnected whose int8 output one Dequantize turns into `output`."""

    sig: lite.Signature
    layer: lite.Node
    dequant: lite.Node
    x: int  # int8 input, weight, bias (-1: none) and output tensors
    w: int
    b: int
    y: int

    @classmethod
    def find(cls, model: lite.Model, output: str) -> _Int8Head | None:
        sig = model.signature("infer")
        producers = _producers(model, model.graphs[sig.graph])
        dequant = producers.get(sig.outputs[output])
        layer = producers.get(dequant.inputs[0]) if dequant is not None else None
        if (
            dequant is None
            or dequant.op != OpCode.DEQUANTIZE
            or layer is None
            or layer.op != OpCode.FULLY_CONNECTED
        ):
            return None
        x, w = layer.inputs[0], layer.inputs[1]
        b = layer.inputs[2] if len(layer.inputs) > 2 else -1
        weight = model.tensors[w]
        if weight.data is None or weight.quantization is None or model.tensors[x].is_constant:
            return None
        if b != -1 and model.tensors[b].quantization is None:
            return None
        return cls(sig, layer, dequant, x, w, b, layer.outputs[0])


@dataclass(frozen=True)
class _FloatHead:
    """The float tensors of the copy: input, trainable weight and bias, output, and the
    requantized output the int8 ops after the head read."""

    x: int
    w: int
    b: int
    y: int
    y_requantized: int

    @classmethod
    def add(cls, model: lite.Model, head: _Int8Head, output: str) -> _FloatHead:
        tensors = model.tensors

        def add(tensor: lite.Tensor) -> int:
            tensors.append(tensor)
            return len(tensors) - 1

        def float_activation(index: int, name: str) -> int:
            return add(
                replace(
                    tensors[index],
                    name=name,
                    dtype=np.dtype(np.float32),
                    quantization=None,
                    data=None,
                )
            )

        def float_parameter(index: int, name: str) -> int:
            t = tensors[index]
            return add(
                lite.Tensor(
                    name, np.dtype(np.float32), t.shape, data=_dequantized(t), trainable=True
                )
            )

        weight = tensors[head.w]
        x = float_activation(head.x, f"{tensors[head.x].name}/float")
        w = float_parameter(head.w, f"{weight.name.removesuffix('/int8')}/float")
        b = -1
        if head.b != -1:
            b = float_parameter(head.b, f"{tensors[head.b].name.removesuffix('/int32')}/float")
        y = float_activation(head.y, f"{output}/float")
        y_requantized = add(replace(tensors[head.y], name=f"{tensors[head.y].name}/requantized"))
        return cls(x, w, b, y, y_requantized)


def _splice(model: lite.Model, head: _Int8Head, floats: _FloatHead, output: str) -> None:
    """Replace the int8 layer and its Dequantize by Dequantize -> float FC -> Quantize; the
    signature's `output` becomes the float FC's output."""
    sig, layer = head.sig, head.layer
    g = model.graphs[sig.graph]
    at = g.nodes.index(next(n for n in g.nodes if n.outputs == layer.outputs))
    old_logits = sig.outputs[output]
    new_nodes = [
        lite.Node(OpCode.DEQUANTIZE, [head.x], [floats.x]),
        lite.Node(
            OpCode.FULLY_CONNECTED,
            [floats.x, floats.w, floats.b],
            [floats.y],
            attrs=dict(layer.attrs),
        ),
        lite.Node(OpCode.QUANTIZE, [floats.y], [floats.y_requantized]),
    ]
    kept = [n for n in g.nodes if n.outputs not in (layer.outputs, head.dequant.outputs)]
    for n in kept:  # the int8 ops after the head read its requantized float output
        n.inputs = [floats.y_requantized if i == head.y else i for i in n.inputs]
    g.nodes = kept[:at] + new_nodes + kept[at:]
    g.outputs = [floats.y if i == old_logits else i for i in g.outputs]
    model.signatures[sig.key] = replace(
        sig, outputs={k: (floats.y if i == old_logits else i) for k, i in sig.outputs.items()}
    )
