"""Activation fusion: an activation that alone reads a Conv/FC/Add output (or a reshape of
one) runs inside it.

The producer's `activation` attribute names the in-place function the kernel applies to
its output (see lite/kernels/activation.py), which saves one pass over the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from sporenet.converter.passes.graph_utils import (
    add_tensor,
    consumers,
    float_attr,
    producers,
    replace_uses,
)
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode
from sporenet.lite.opset import DECLARATIONS
from sporenet.lite.opset.decl import CLAMPS, FUSABLE, Activation, DerivedMap, derived_set

__all__ = ["ACTIVATION_OPS", "CLAMPS", "FUSES_INTO", "fuse_activations", "unfuse_activations"]

FUSES_INTO: Set[OpCode] = derived_set(lambda d: bool(d.fuses))
"""Ops the pass may fuse an activation into (`OpDecl.fuses` names which)."""
ACTIVATION_OPS: Mapping[str, OpCode] = DerivedMap(
    lambda: {d.activation: op for op, d in DECLARATIONS.items() if d.activation in FUSABLE}
)
"""Fused activation -> the op computing it alone (`OpDecl.activation`)."""


def fused_form(node: Node) -> dict[str, Any] | None:
    """The `activation` attributes equivalent to an activation node, or None."""
    if node.op == OpCode.CLIP and len(node.inputs) == 1:
        return _clip_form(node)
    decl = DECLARATIONS.get(node.op)
    if decl is None or decl.activation not in FUSABLE:
        return None
    if decl.activation == Activation.LEAKY_RELU:
        return {"activation": Activation.LEAKY_RELU, "alpha": float_attr(node, "alpha", 0.01)}
    return {"activation": decl.activation}


def _clip_form(node: Node) -> dict[str, Any]:
    lo = float_attr(node, "min", float("-inf")) if "min" in node.attrs else None
    hi = float_attr(node, "max", float("inf")) if "max" in node.attrs else None
    if lo == 0 and hi == 6:
        return {"activation": Activation.RELU6}
    if lo == 0 and hi is None:
        return {"activation": Activation.RELU}
    attrs: dict[str, Any] = {"activation": Activation.CLIP}
    if lo is not None:
        attrs["clip_min"] = lo
    if hi is not None:
        attrs["clip_max"] = hi
    return attrs


RESHAPES: Set[OpCode] = frozenset({OpCode.SQUEEZE, OpCode.UNSQUEEZE, OpCode.RESHAPE})
"""Ops that only reshape their input: an elementwise activation after one applies as well
before it (a 1-D convolution exported as Unsqueeze -> Conv -> Squeeze -> Relu)."""


def _through_reshape(
    node: Node | None, made: Mapping[int, Node], uses: Mapping[int, list[Node]], outs: list[int]
) -> Node | None:
    """The node whose output `node` reshapes, when `node` is a reshape whose input has no
    other reader and is no graph output; else `node` itself."""
    if node is None or node.op not in RESHAPES or not node.inputs:
        return node
    inner = node.inputs[0]
    if len(uses.get(inner, [])) != 1 or inner in outs:
        return None
    return made.get(inner)


def fuse_activations(model: Model) -> int:
    """Fuse every fusable activation into its producer; returns how many were fused."""
    fused = 0
    for gi, graph in enumerate(model.graphs):
        uses = consumers(graph)
        made = producers(graph)
        for act in list(graph.nodes):
            form = fused_form(act)
            if form is None or not act.inputs:
                continue
            x = act.inputs[0]
            prev = _through_reshape(made.get(x), made, uses, graph.outputs)
            if (
                prev is None
                or prev.op not in FUSES_INTO
                or form["activation"] not in DECLARATIONS[prev.op].fuses
                or len(uses.get(x, [])) != 1
                or x in graph.outputs
                or model.tensors[x].dtype.kind != "f"
                or prev.attrs.get("activation", "none") != "none"
                or (form["activation"] == "leaky_relu" and "alpha" in prev.attrs)
            ):
                continue
            prev.attrs = {**prev.attrs, **form}
            graph.nodes.remove(act)
            replace_uses(model, gi, act.outputs[0], x)
            model.tensors[x].name, model.tensors[act.outputs[0]].name = (
                model.tensors[act.outputs[0]].name,
                model.tensors[x].name,
            )
            fused += 1
    return fused


def unfuse_activations(model: Model, keep: Set[str] = CLAMPS) -> int:
    """Split each fused activation not in `keep` off its node, as its own node writing the
    node's output (the inverse of fuse_activations); returns how many were split."""
    split = 0
    for graph in model.graphs:
        nodes: list[Node] = []
        for node in graph.nodes:
            name = str(node.attrs.get("activation", "none"))
            if name in keep or name not in ACTIVATION_OPS:
                nodes.append(node)
                continue
            out = node.outputs[0]
            pre = add_tensor(model, f"{model.tensors[out].name}/pre_activation", out)
            params = {"alpha": node.attrs.get("alpha", 0.01)} if name == "leaky_relu" else {}
            dropped = {"activation", *params}
            node.attrs = {k: v for k, v in node.attrs.items() if k not in dropped}
            node.outputs = [pre, *node.outputs[1:]]
            op = ACTIVATION_OPS[name]
            activation = Node(op, [pre], [out], params, name=f"{node.name}/{name}")
            nodes += [node, activation]
            split += 1
        graph.nodes = nodes
    return split
