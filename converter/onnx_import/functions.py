"""Ops that ONNX defines by a function body are imported by expanding that body.

ONNX specifies ops such as Attention or SoftmaxCrossEntropyLoss as a FunctionProto made of
simpler ops (for some ops the body depends on input types and attributes: a
"context-dependent" function). Before import, every node of an op listed in FUNCTION_OPS
that has no handler of its own is replaced by its body, with edges renamed into a private
namespace and attribute references resolved; nested function ops expand in turn. The list
is explicit (like the handler registry) and holds the ops whose bodies the conformance suite
shows convert.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper

from sporenet.converter.errors import ConversionError

FUNCTION_OPS = frozenset(
    {
        "Attention",
        "CausalConvWithState",
        "CenterCropPad",
        "NegativeLogLikelihoodLoss",
        "RotaryEmbedding",
        "SoftmaxCrossEntropyLoss",
    }
)
"""Op types imported through their ONNX function body."""

_MAX_DEPTH = 8  # nested function ops: a body's ops may themselves be functions
_DEFAULT_DOMAINS = ("", "ai.onnx")


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of every value ONNX shape inference can type (needed by context-dependent
    function bodies, which differ with input types)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):  # fall back to what is declared
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type for v in [*graph.value_info, *graph.input, *graph.output]}
    for t in graph.initializer:
        types[t.name] = helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def _function(
    node: onnx.NodeProto,
    opset: int,
    types: dict[str, onnx.TypeProto],
) -> onnx.FunctionProto:
    schema: Any = onnx.defs.get_schema(node.op_type, opset)  # the stubs lack these methods
    for name, attr in schema.attributes.items():  # defaults the body may refer to
        if name not in {a.name for a in node.attribute} and attr.default_value.name:
            node.attribute.append(attr.default_value)
    proto = onnx.FunctionProto()
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if versions:
        proto.ParseFromString(schema.get_function_with_opset_version(max(versions)))
        return proto
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not versions:
        raise ConversionError(f"{node.op_type}: ONNX defines no function body for opset {opset}")
    input_types = []
    for name in node.input:
        if name and name not in types:
            raise ConversionError(
                f"{node.op_type} node {node.name!r}: the type of input "
                f"{name!r} is unknown, so its function body cannot be built"
            )
        input_types.append(types[name].SerializeToString() if name else b"")
    proto.ParseFromString(
        schema.get_context_dependent_function_with_opset_version(
            max(versions), node.SerializeToString(), input_types
        )
    )
    return proto


def _expand(
    node: onnx.NodeProto,
    proto: onnx.FunctionProto,
    prefix: str,
) -> list[onnx.NodeProto]:
    names = {
        formal: (node.input[k] if k < len(node.input) else "")
        for k, formal in enumerate(proto.input)
    }
    for k, formal in enumerate(proto.output):
        if k < len(node.output) and node.output[k]:
            names[formal] = node.output[k]
    attrs = {a.name: a for a in node.attribute}

    def rename(name: str) -> str:
        return names.get(name, prefix + name) if name else ""

    body = []
    for inner in proto.node:
        new = onnx.NodeProto()
        new.CopyFrom(inner)
        new.name = prefix + (inner.name or (inner.output[0] if inner.output else inner.op_type))
        new.input[:] = [rename(n) for n in inner.input]
        new.output[:] = [rename(n) for n in inner.output]
        del new.attribute[:]
        for attr in inner.attribute:
            if attr.ref_attr_name:
                if attr.ref_attr_name in attrs:
                    value = onnx.AttributeProto()
                    value.CopyFrom(attrs[attr.ref_attr_name])
                    value.name = attr.name
                    new.attribute.append(value)
                continue
            if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                raise ConversionError(f"{node.op_type}: its function body has subgraphs")
            new.attribute.append(attr)
        body.append(new)
    return body


def expand_functions(
    model: onnx.ModelProto, opset: int, has_handler: Callable[[str], bool]
) -> onnx.ModelProto:
    """`model` with every FUNCTION_OPS node that has no handler replaced by its body."""

    def expandable(n: onnx.NodeProto) -> bool:
        return (
            n.domain in _DEFAULT_DOMAINS
            and n.op_type in FUNCTION_OPS
            and not has_handler(n.op_type)
        )

    if not any(expandable(n) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for _ in range(_MAX_DEPTH):
        if not any(expandable(n) for n in out.graph.node):
            return out
        types = _value_types(out)
        nodes: list[onnx.NodeProto] = []
        for position, node in enumerate(out.graph.node):
            if not expandable(node):
                nodes.append(node)
                continue
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            proto = _function(copy, opset, types)
            label = node.name or (node.output[0] if node.output else str(position))
            nodes.extend(_expand(copy, proto, f"{label}/{node.op_type}#{position}/"))
        del out.graph.node[:]
        out.graph.node.extend(nodes)
    raise ConversionError(f"function ops nest deeper than {_MAX_DEPTH} levels")
