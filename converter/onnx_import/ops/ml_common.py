"""Helpers shared by the ai.onnx.ml handlers: attribute tables, tensor attributes, class
labels and the label output."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.in_place import tensor_value
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.dtypes import STRING
from sporenet.lite.ops import OpCode


def strings(values: Any) -> np.ndarray:
    """A STRING array (object array of str) from a list of bytes or str."""
    out = np.empty(len(values), STRING)
    out[:] = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    return out


def floats(ctx: ImportContext, node: OnnxNode, name: str) -> np.ndarray | None:
    """A float attribute list, or its `<name>_as_tensor` twin (float64 kept), or None."""
    tensor = node.attrs.get(f"{name}_as_tensor")
    if isinstance(tensor, onnx.TensorProto):
        return tensor_value(tensor, ctx.data).ravel()
    value = node.attrs.get(name)
    return None if value is None else np.asarray(value, np.float64)


def tensor_attr(ctx: ImportContext, node: OnnxNode, name: str) -> np.ndarray | None:
    """A TENSOR attribute's value, or None. Large ones are read in place, from the
    model's own bytes (converter/onnx_import/in_place.py), as initializers are."""
    tensor = node.attrs.get(name)
    if isinstance(tensor, onnx.TensorProto):
        value = tensor_value(tensor, ctx.data)
        return strings(value.ravel()).reshape(value.shape) if value.dtype.kind in "OSU" else value
    return None


def class_labels(node: OnnxNode) -> np.ndarray:
    """classlabels_strings (STRING) or classlabels_int64s (int64); one of them is required."""
    names = node.attrs.get("classlabels_strings")
    if names:
        return strings(names)
    ints = node.attrs.get("classlabels_int64s", node.attrs.get("classlabels_ints"))
    if ints:
        return np.asarray(ints, np.int64)
    raise node.fail("needs classlabels_strings or classlabels_int64s")


def label_output(ctx: ImportContext, node: OnnxNode, index: int, labels: np.ndarray) -> int:
    """The label tensor: `labels` gathered at the kernel's label indices."""
    table = ctx.constant(f"{node.name}/classlabels", labels)
    return ctx.emit1(OpCode.GATHER, [table, index], axis=0)


def as_float32(ctx: ImportContext, x: int) -> int:
    """`x` cast to float32 (unchanged when it is float32)."""
    if ctx.dtype(x) == np.float32:
        return x
    return ctx.emit1(OpCode.CAST, [x], to="float32")


def as_matrix(ctx: ImportContext, x: int) -> int:
    """`x` as [N, F]: a 1-D input is one sample; higher ranks keep the first axis."""
    rank = ctx.rank(x)
    if rank == 2:
        return x
    if rank == 1:
        return ctx.emit1(OpCode.UNSQUEEZE, [x], axes=[0])
    return ctx.emit1(OpCode.FLATTEN, [x], axis=1)
