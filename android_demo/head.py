"""Which weights personalization trains: the model's head, found by walking back from its
logits.

The head is the last layer with float weights before the logits (a FullyConnected,
Conv2D or MatMul, plus a bias Add after it), reached through ops that carry no weights
(Reshape, Flatten, Squeeze, Dequantize...). Where that layer's weights are integer (an
int8 model) the runtime cannot train them in place; the head is then unavailable and the
reason says so, so the app can refuse personalization with a 4xx instead of failing.
"""

from __future__ import annotations

from dataclasses import dataclass

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
