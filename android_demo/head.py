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
    sig = model.signature("infer")
    graph = model.graphs[sig.graph]
    producers = _producers(model, graph)
    dequant = producers.get(sig.outputs[output])
    layer = producers.get(dequant.inputs[0]) if dequant is not None else None
    if (
        dequant is None
        or dequant.op != OpCode.DEQUANTIZE
        or layer is None
        or layer.op != OpCode.FULLY_CONNECTED
    ):
        return model, find_head(model, output)
    x_q, w_q = layer.inputs[0], layer.inputs[1]
    b_q = layer.inputs[2] if len(layer.inputs) > 2 else -1
    y_q = layer.outputs[0]
    weight = model.tensors[w_q]
    if weight.data is None or weight.quantization is None or model.tensors[x_q].is_constant:
        return model, find_head(model, output)
    if b_q != -1 and model.tensors[b_q].quantization is None:
        return model, find_head(model, output)
    out = copy.deepcopy(model)
    tensors, g = out.tensors, out.graphs[sig.graph]

    def add(tensor: lite.Tensor) -> int:
        tensors.append(tensor)
        return len(tensors) - 1

    base = weight.name.removesuffix("/int8")
    x_f = add(
        replace(
            tensors[x_q],
            name=f"{tensors[x_q].name}/float",
            dtype=np.dtype(np.float32),
            quantization=None,
            data=None,
        )
    )
    w_f = add(
        lite.Tensor(
            f"{base}/float",
            np.dtype(np.float32),
            weight.shape,
            data=_dequantized(weight),
            trainable=True,
        )
    )
    b_f = -1
    if b_q != -1:
        bias = tensors[b_q]
        b_f = add(
            lite.Tensor(
                f"{bias.name.removesuffix('/int32')}/float",
                np.dtype(np.float32),
                bias.shape,
                data=_dequantized(bias),
                trainable=True,
            )
        )
    y_f = add(
        replace(
            tensors[y_q],
            name=f"{output}/float",
            dtype=np.dtype(np.float32),
            quantization=None,
            data=None,
        )
    )
    y_q2 = add(replace(tensors[y_q], name=f"{tensors[y_q].name}/requantized"))
    at = g.nodes.index(next(n for n in g.nodes if n.outputs == layer.outputs))
    old_logits = sig.outputs[output]
    new_nodes = [
        lite.Node(OpCode.DEQUANTIZE, [x_q], [x_f]),
        lite.Node(OpCode.FULLY_CONNECTED, [x_f, w_f, b_f], [y_f], attrs=dict(layer.attrs)),
        lite.Node(OpCode.QUANTIZE, [y_f], [y_q2]),
    ]
    kept = [n for n in g.nodes if n.outputs not in (layer.outputs, dequant.outputs)]
    for n in kept:  # the int8 ops after the head read its requantized float output
        n.inputs = [y_q2 if i == y_q else i for i in n.inputs]
    g.nodes = kept[:at] + new_nodes + kept[at:]
    g.outputs = [y_f if i == old_logits else i for i in g.outputs]
    out.signatures[sig.key] = replace(
        sig, outputs={k: (y_f if i == old_logits else i) for k, i in sig.outputs.items()}
    )
    lite.validate(out)
    return out, Head(frozenset({tensors[w_f].name, *([tensors[b_f].name] if b_f != -1 else [])}))
