"""ai.onnx.ml feature preprocessing, built from the runtime's elementwise ops: Scaler,
Normalizer, Binarizer, Imputer, FeatureVectorizer, ArrayFeatureExtractor."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.onnx_import.ops import ml_common as mc
from sporenet.lite.ops import OpCode


def _const(
    ctx: ImportContext, node: OnnxNode, name: str, value: ArrayLike, dtype: DTypeLike
) -> int:
    return ctx.constant(f"{node.name}/{name}", np.asarray(value, dtype))


def scaler(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """(x - offset) * scale per feature (one value or one per feature), float32."""
    x = mc.as_float32(ctx, node.input(0))
    offset = np.asarray(node.attrs.get("offset", [0.0]), np.float32)
    scale = np.asarray(node.attrs.get("scale", [1.0]), np.float32)
    shifted = ctx.emit1(OpCode.SUB, [x, _const(ctx, node, "offset", offset, np.float32)])
    return [ctx.emit1(OpCode.MUL, [shifted, _const(ctx, node, "scale", scale, np.float32)])]


def normalizer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Each row divided by its MAX, L1 or L2 norm (a zero norm leaves the row as it is)."""
    x = mc.as_float32(ctx, mc.as_matrix(ctx, node.input(0)))
    norm = node.attr("norm", "MAX")
    if norm == "MAX":
        total = ctx.emit1(OpCode.REDUCE_MAX, [x], axes=[1], keepdims=1)
    elif norm == "L1":
        total = ctx.emit1(OpCode.REDUCE_SUM, [ctx.emit1(OpCode.ABS, [x])], axes=[1], keepdims=1)
    elif norm == "L2":
        squares = ctx.emit1(OpCode.MUL, [x, x])
        summed = ctx.emit1(OpCode.REDUCE_SUM, [squares], axes=[1], keepdims=1)
        total = ctx.emit1(OpCode.SQRT, [summed])
    else:
        raise node.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    zero = _const(ctx, node, "zero", 0.0, np.float32)
    one = _const(ctx, node, "one", 1.0, np.float32)
    is_zero = ctx.emit1(OpCode.EQUAL, [total, zero])
    safe = ctx.emit1(OpCode.WHERE, [is_zero, one, total])
    return [ctx.emit1(OpCode.DIV, [x, safe])]


def binarizer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """1 where x > threshold, else 0, in x's dtype."""
    x = node.input(0)
    dtype = ctx.dtype(x)
    threshold = _const(ctx, node, "threshold", node.attr("threshold", 0.0), dtype)
    above = ctx.emit1(OpCode.GREATER, [x, threshold])
    return [ctx.emit1(OpCode.CAST, [above], to=str(dtype))]


def imputer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Values equal to the replaced value (NaN: every NaN) become the imputed value of
    their feature (one value or one per feature)."""
    x = node.input(0)
    dtype = ctx.dtype(x)
    if dtype.kind == "f":
        imputed = node.attrs.get("imputed_value_floats") or []
        replaced = float(node.attr("replaced_value_float", 0.0))
    else:
        imputed = node.attrs.get("imputed_value_int64s") or []
        replaced = int(node.attr("replaced_value_int64", 0))
    if not imputed:
        raise node.fail("needs imputed_value_floats or imputed_value_int64s")
    fill = _const(ctx, node, "imputed", imputed, dtype)
    if dtype.kind == "f" and np.isnan(replaced):
        same = ctx.emit1(OpCode.EQUAL, [x, x])
        hit = ctx.emit1(OpCode.EQUAL, [same, _const(ctx, node, "false", False, np.bool_)])
    else:
        hit = ctx.emit1(OpCode.EQUAL, [x, _const(ctx, node, "replaced", replaced, dtype)])
    return [ctx.emit1(OpCode.WHERE, [hit, fill, x])]


def feature_vectorizer(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """The inputs as float32 [N, d_k] blocks side by side (inputdimensions gives each d_k)."""
    dims = node.ints("inputdimensions", []) or []
    inputs = [i for i in node.inputs if i != -1]
    if len(dims) != len(inputs):
        raise node.fail(f"inputdimensions has {len(dims)} entries for {len(inputs)} inputs")
    blocks = []
    for index, dim in zip(inputs, dims, strict=True):
        block = mc.as_float32(ctx, mc.as_matrix(ctx, index))
        if ctx.shape(block)[-1] != dim:
            raise node.fail(f"an input has {ctx.shape(block)[-1]} features, declared {dim}")
        blocks.append(block)
    if len(blocks) == 1:
        return blocks
    return [ctx.emit1(OpCode.CONCAT, blocks, axis=1)]


def array_feature_extractor(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x[..., indices] along the last axis; a 1-D x gives [1, len(indices)]."""
    x, indices = node.input(0), node.input(1)
    if ctx.dtype(indices) != np.int64:
        indices = ctx.emit1(OpCode.CAST, [indices], to="int64")
    if ctx.rank(indices) != 1:
        indices = ctx.emit1(OpCode.RESHAPE, [indices, _const(ctx, node, "flat", [-1], np.int64)])
    out = ctx.emit1(OpCode.GATHER, [x, indices], axis=-1)
    if ctx.rank(x) == 1:
        out = ctx.emit1(OpCode.UNSQUEEZE, [out], axes=[0])
    return [out]
