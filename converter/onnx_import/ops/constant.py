"""Constants and pass-through ops: Constant, ConstantOfShape, Shape, Size, Identity, Dropout."""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import MAX_TENSOR_BYTES, ImportContext
from sporenet.converter.onnx_import.in_place import tensor_value
from sporenet.converter.onnx_import.node import OnnxNode, as_ints
from sporenet.converter.passes.graph_utils import MATERIALIZE_LIMIT
from sporenet.lite import lowp
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.kernels import KERNELS
from sporenet.lite.ops import OpCode


def constant(ctx: ImportContext, node: OnnxNode) -> list[int]:
    attrs = node.attrs
    if "value" in attrs:
        value = lowp.from_foreign(tensor_value(attrs["value"], ctx.data))
    elif "value_float" in attrs:
        value = np.array(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        value = np.array(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        value = np.array(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        value = np.array(attrs["value_ints"], np.int64)
    else:
        raise node.fail(
            f"only tensor, float(s) and int(s) values are supported, got {sorted(attrs)}"
        )
    if value.dtype.kind in "USO":
        raise node.fail("string constants are not supported")
    return [ctx.constant(node.outputs[0], value)]


def constant_of_shape(ctx: ImportContext, node: OnnxNode) -> list[int]:
    shape = as_ints(ctx.value(node.input(0)))
    fill = (
        lowp.from_foreign(tensor_value(node.attrs["value"], ctx.data)).reshape(())
        if "value" in node.attrs
        else np.array(0, np.float32)
    )
    if shape is None:
        # A shape computed from a dynamic input dimension: an Expand of the fill value that
        # the runtime plans (and folds) for the concrete input shapes.
        scalar = ctx.constant(f"{node.outputs[0]}/value", fill)
        return [ctx.emit1(OpCode.EXPAND, [scalar, node.input(0)])]
    if any(d < 0 for d in shape):
        raise node.fail(f"shape {shape} has a negative dimension")
    nbytes = int(np.prod(shape, dtype=np.float64)) * fill.dtype.itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise node.fail(
            f"a {shape} fill needs {nbytes:,} bytes, more than the "
            f"{MAX_TENSOR_BYTES:,} a tensor may hold"
        )
    if nbytes > MATERIALIZE_LIMIT and OpCode.EXPAND in KERNELS:
        # A large fill stays a node (Expand of a scalar) that the runtime folds at load time,
        # so the file does not store megabytes of one repeated value.
        scalar = ctx.constant(f"{node.outputs[0]}/value", fill)
        return [ctx.emit1(OpCode.EXPAND, [scalar], shape=shape)]
    return [ctx.constant(node.outputs[0], np.full(shape, fill, fill.dtype))]


def shape(ctx: ImportContext, node: OnnxNode) -> list[int]:
    x = node.input(0)
    dims = ctx.shape(x)
    start, end = node.attr("start", 0), node.attr("end", None)
    if DYNAMIC not in dims[slice(start, end)]:
        return [ctx.constant(node.outputs[0], np.array(dims[slice(start, end)], np.int64))]
    out = ctx.emit1(OpCode.SHAPE, [x], start=start if start else None, end=end)
    # Under each assignment of the dynamic dimensions the shape is known: tracking it lets a
    # Reshape computed from it keep the dynamic batch (see shape.reshape).
    ctx.set_view_values(
        out, [np.array(view[x].shape[slice(start, end)], np.int64) for view in ctx.views]
    )
    return [out]


def size(ctx: ImportContext, node: OnnxNode) -> list[int]:
    dims = ctx.shape(node.input(0))
    if DYNAMIC in dims:
        # The product of a shape the runtime knows when it plans the graph.
        shape = ctx.emit1(OpCode.SHAPE, [node.input(0)])
        ctx.set_view_values(shape, [np.array(view[node.input(0)].shape) for view in ctx.views])
        return [ctx.emit1(OpCode.REDUCE_PROD, [shape], axes=[0], keepdims=0)]
    return [ctx.constant(node.outputs[0], np.array(int(np.prod(dims, dtype=np.int64)), np.int64))]


def identity(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [node.input(0)]


def dropout(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Inference: output = input; the optional mask is all ones."""
    training_input = node.input(2)
    training = ctx.value(training_input)
    if training_input != -1 and training is None:
        raise node.fail("training_mode must be static (the converter targets inference)")
    if training is not None and bool(np.ravel(training)[0]):
        raise node.fail("training_mode=True is not supported (the converter targets inference)")
    x = node.input(0)
    results = [x]
    if node.num_outputs > 1:
        dims = ctx.shape(x)
        if DYNAMIC in dims:
            raise node.fail("the mask output needs a static input shape")
        results.append(ctx.constant(node.outputs[1], np.ones(dims, np.bool_)))
    return results
