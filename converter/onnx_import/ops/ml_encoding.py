"""ai.onnx.ml encodings of categories: LabelEncoder and CategoryMapper -> LABEL_ENCODER,
OneHotEncoder (compared against its categories), and ZipMap.

ZipMap's output is a sequence of maps, which the IR cannot hold: the converter gives the
probability tensor itself [N, classes] and records the class labels, in column order, in
the model's metadata under `zipmap:<output name>` (a JSON list), so a caller can build the
maps. Conversion reports it as a note, not as an error."""

from __future__ import annotations

import json

import numpy as np
from numpy.typing import ArrayLike

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import ml_common as mc
from sporenet.lite.dtypes import STRING
from sporenet.lite.ops import OpCode


def _table(ctx: ImportContext, node: OnnxNode, side: str) -> np.ndarray | None:
    """keys_* or values_* of a LabelEncoder (strings, int64s, floats or a tensor)."""
    tensor = mc.tensor_attr(ctx, node, f"{side}_tensor")
    if tensor is not None:
        return tensor.ravel()
    if node.attrs.get(f"{side}_strings"):
        return mc.strings(node.attrs[f"{side}_strings"])
    if node.attrs.get(f"{side}_int64s"):
        return np.asarray(node.attrs[f"{side}_int64s"], np.int64)
    if node.attrs.get(f"{side}_floats"):
        return np.asarray(node.attrs[f"{side}_floats"], np.float32)
    return None


def _default(ctx: ImportContext, node: OnnxNode, values: np.ndarray) -> np.ndarray:
    tensor = mc.tensor_attr(ctx, node, "default_tensor")
    if tensor is not None:
        return tensor.ravel()[:1].astype(values.dtype)
    if values.dtype == STRING:
        return mc.strings([node.attr("default_string", "_Unused")])
    if values.dtype.kind == "f":
        return np.asarray([node.attr("default_float", -0.0)], values.dtype)
    return np.asarray([node.attr("default_int64", -1)], values.dtype)


def _encode(
    ctx: ImportContext, node: OnnxNode, keys: np.ndarray, values: np.ndarray, default: ArrayLike
) -> list[int]:
    x = node.input(0)
    if ctx.dtype(x) != STRING and keys.dtype != STRING and ctx.dtype(x) != keys.dtype:
        keys = keys.astype(ctx.dtype(x))
    name = node.name
    inputs = [
        x,
        ctx.constant(f"{name}/keys", keys),
        ctx.constant(f"{name}/values", values),
        ctx.constant(f"{name}/default", np.asarray(default).reshape(())),
    ]
    return [ctx.emit1(OpCode.LABEL_ENCODER, inputs)]


def label_encoder(ctx: ImportContext, node: OnnxNode) -> list[int]:
    keys, values = _table(ctx, node, "keys"), _table(ctx, node, "values")
    if keys is None or values is None:
        raise node.fail("needs keys_* and values_* attributes")
    return _encode(ctx, node, keys, values, _default(ctx, node, values))


def category_mapper(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Strings to int64 or int64 to strings, by the input's dtype."""
    names = mc.strings(node.attrs.get("cats_strings", []))
    ids = np.asarray(node.attrs.get("cats_int64s", []), np.int64)
    if names.size != ids.size:
        raise node.fail("cats_strings and cats_int64s must have one length")
    if ctx.dtype(node.input(0)) == STRING:
        return _encode(ctx, node, names, ids, np.int64(node.attr("default_int64", -1)))
    default = mc.strings([node.attr("default_string", "_Unused")])[0]
    return _encode(ctx, node, ids, names, np.asarray(default, dtype=object))


def one_hot_encoder(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x [..] -> float32 [.., categories]: 1 where x equals a category."""
    x = node.input(0)
    if node.attrs.get("cats_strings"):
        cats = mc.strings(node.attrs["cats_strings"])
    else:
        cats = np.asarray(node.attrs.get("cats_int64s", []), np.int64)
        if ctx.dtype(x) != np.int64:
            x = ctx.emit1(OpCode.CAST, [x], to="int64")
    if cats.size == 0:
        raise node.fail("needs cats_strings or cats_int64s")
    if (cats.dtype == STRING) != (ctx.dtype(x) == STRING):
        raise node.fail(f"input {ctx.dtype(x)} does not match categories of {cats.dtype}")
    if int(node.attr("zeros", 1)) == 0:
        raise node.fail("zeros=0 (fail on an unknown category) is not supported")
    wide = ctx.emit1(OpCode.UNSQUEEZE, [x], axes=[ctx.rank(x)])
    hit = ctx.emit1(OpCode.EQUAL, [wide, ctx.constant(f"{node.name}/categories", cats)])
    return [ctx.emit1(OpCode.CAST, [hit], to="float32")]


def zip_map(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """The probabilities as they are; the labels go to metadata (see the module doc)."""
    labels = mc.class_labels(node)
    probs = node.input(0)
    if ctx.rank(probs) != 2 or ctx.shape(probs)[1] not in (-1, labels.size):
        raise node.fail(f"expects probabilities [N, {labels.size}], got {list(ctx.shape(probs))}")
    if node.outputs and node.outputs[0]:
        ctx.metadata[f"zipmap:{node.outputs[0]}"] = json.dumps(labels.tolist())
    return [ctx.emit1(OpCode.IDENTITY, [probs])]
