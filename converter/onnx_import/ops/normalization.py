"""BatchNormalization, InstanceNormalization, LRN, LayerNormalization, Softmax/LogSoftmax."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.ops import OpCode

Handler = Callable[[ImportContext, OnnxNode], list[int]]


def batch_norm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    if int(node.attr("training_mode", 0)):
        return _batch_norm_training(ctx, node)
    node.only_first_output()
    if node.opset < 9 and int(node.attr("spatial", 1)) != 1:
        raise node.fail("spatial=0 (per-element statistics) is not supported")
    inputs = [node.input(k) for k in range(5)]
    return [ctx.emit1(OpCode.BATCH_NORM, inputs, epsilon=float(node.attr("epsilon", 1e-5)))]


def _batch_norm_training(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """training_mode=1 (opset 14+): Y normalized by the batch's statistics (mean and
    population variance over every axis but 1), and the running statistics updated as
    running = input * momentum + batch * (1 - momentum), as outputs 1 and 2."""
    x, scale, bias, mean, var = (node.input(k) for k in range(5))
    rank, channels = ctx.rank(x), ctx.shape(x)[1]
    if channels < 0:
        raise node.fail(f"training_mode=1 needs a static channel count, got {ctx.shape(x)}")
    axes = [0, *range(2, rank)]
    momentum = float(node.attr("momentum", 0.9))
    dtype = ctx.dtype(x)
    batch_mean = ctx.emit1(OpCode.REDUCE_MEAN, [x], axes=axes, keepdims=1)
    centered = ctx.emit1(OpCode.SUB, [x, batch_mean])
    squared = ctx.emit1(OpCode.MUL, [centered, centered])
    batch_var = ctx.emit1(OpCode.REDUCE_MEAN, [squared], axes=axes, keepdims=1)
    stats = [ctx.emit1(OpCode.RESHAPE, [t], shape=[channels]) for t in (batch_mean, batch_var)]
    y = ctx.emit1(
        OpCode.BATCH_NORM,
        [x, scale, bias, *stats],
        epsilon=float(node.attr("epsilon", 1e-5)),
    )
    results = [y]
    if node.num_outputs > 1:
        keep = ctx.constant(f"{node.name}/momentum", np.array(momentum, dtype))
        take = ctx.constant(f"{node.name}/one_minus_momentum", np.array(1 - momentum, dtype))
        for running, batch in list(zip((mean, var), stats, strict=True))[: node.num_outputs - 1]:
            kept = ctx.emit1(OpCode.MUL, [running, keep])
            results.append(ctx.emit1(OpCode.ADD, [kept, ctx.emit1(OpCode.MUL, [batch, take])]))
    return results


def instance_norm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    inputs = [node.input(k) for k in range(3)]
    return [ctx.emit1(OpCode.INSTANCE_NORM, inputs, epsilon=float(node.attr("epsilon", 1e-5)))]


def lrn(ctx: ImportContext, node: OnnxNode) -> list[int]:
    return [
        ctx.emit1(
            OpCode.LRN,
            [node.input(0)],
            size=int(node.attr("size")),
            alpha=float(node.attr("alpha", 1e-4)),
            beta=float(node.attr("beta", 0.75)),
            bias=float(node.attr("bias", 1.0)),
        )
    ]


def layer_norm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Y from the runtime's LayerNorm; the optional Mean and InvStdDev outputs (statistics
    over axes axis..rank-1, kept as size-1 axes) from ReduceMean nodes when requested."""
    x = node.input(0)
    axis = int(node.attr("axis", -1))
    epsilon = float(node.attr("epsilon", 1e-5))
    inputs = [x, node.input(1), node.input(2)]
    if inputs[-1] == -1:
        inputs.pop()
    results = [ctx.emit1(OpCode.LAYER_NORM, inputs, axis=axis, epsilon=epsilon)]
    if node.num_outputs > 1:
        rank = ctx.rank(x)
        axes = list(range(axis + rank if axis < 0 else axis, rank))
        if ctx.dtype(x) != np.float32:
            raise node.fail("Mean/InvStdDev outputs are supported for float32 inputs only")
        mean = ctx.emit1(OpCode.REDUCE_MEAN, [x], axes=axes, keepdims=1)
        centered = ctx.emit1(OpCode.SUB, [x, mean])
        var = ctx.emit1(
            OpCode.REDUCE_MEAN, [ctx.emit1(OpCode.MUL, [centered, centered])], axes=axes, keepdims=1
        )
        eps = ctx.constant(f"{node.name}/epsilon", np.array(epsilon, np.float32))
        inv_std = ctx.emit1(OpCode.RSQRT, [ctx.emit1(OpCode.ADD, [var, eps])])
        results += [mean, inv_std]
    return results


def softmax(op: OpCode) -> Handler:
    """Opset 13+: along `axis` (default -1). Before 13: the input is coerced to 2-D at
    `axis` (default 1) and normalized over the flattened trailing block, so the handler
    emits Flatten + op(axis=-1) + Reshape back, unless `axis` is already the last one."""

    def convert(ctx: ImportContext, node: OnnxNode) -> list[int]:
        x = node.input(0)
        rank = ctx.rank(x)
        if node.opset >= 13:
            return [ctx.emit1(op, [x], axis=int(node.attr("axis", -1)))]
        axis = int(node.attr("axis", 1))
        if axis < 0:
            axis += rank
        if rank == 0 or axis >= rank - 1:
            return [ctx.emit1(op, [x], axis=-1)]
        shape = list(ctx.shape(x))
        if shape.count(DYNAMIC) > 1:
            raise node.fail(
                f"opset-{node.opset} {node.op_type} over a trailing block needs at "
                f"most one dynamic dimension, got shape {shape}"
            )
        flat = ctx.emit1(OpCode.FLATTEN, [x], axis=axis)
        y = ctx.emit1(op, [flat], axis=-1)
        return [ctx.emit1(OpCode.RESHAPE, [y], shape=shape)]

    return convert


def _axes_from(ctx: ImportContext, x: int, axis: int) -> list[int]:
    rank = ctx.rank(x)
    return list(range(axis + rank if axis < 0 else axis, rank))


def rms_norm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Y = X / sqrt(mean(X², axes axis..) + epsilon) * scale, normalized in float32 when
    stash_type is 1 (the ONNX function body), then cast back before the scale."""
    x, scale = node.input(0), node.input(1)
    dtype = ctx.dtype(x)
    axes = _axes_from(ctx, x, int(node.attr("axis", -1)))
    stash = int(node.attr("stash_type", 1)) == 1 and dtype != np.float32
    xs = ctx.emit1(OpCode.CAST, [x], to="float32") if stash else x
    mean_sq = ctx.emit1(
        OpCode.REDUCE_MEAN, [ctx.emit1(OpCode.MUL, [xs, xs])], axes=axes, keepdims=1
    )
    eps = ctx.constant(f"{node.name}/epsilon", np.array(node.attr("epsilon", 1e-5), ctx.dtype(xs)))
    inv = ctx.emit1(OpCode.RSQRT, [ctx.emit1(OpCode.ADD, [mean_sq, eps])])
    normalized = ctx.emit1(OpCode.MUL, [xs, inv])
    if stash:
        normalized = ctx.emit1(OpCode.CAST, [normalized], to=str(dtype))
    return [ctx.emit1(OpCode.MUL, [normalized, scale])]


def mean_variance_norm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """(X - E[X]) / (sqrt(E[X²] - E[X]²) + 1e-9) over `axes` (default [0, 2, 3]), as the
    ONNX function body computes it."""
    x = node.input(0)
    axes = node.ints("axes") or [0, 2, 3]
    mean = ctx.emit1(OpCode.REDUCE_MEAN, [x], axes=axes, keepdims=1)
    mean_sq = ctx.emit1(OpCode.REDUCE_MEAN, [ctx.emit1(OpCode.MUL, [x, x])], axes=axes, keepdims=1)
    variance = ctx.emit1(OpCode.SUB, [mean_sq, ctx.emit1(OpCode.MUL, [mean, mean])])
    eps = ctx.constant(f"{node.name}/epsilon", np.array(1e-9, ctx.dtype(x)))
    std = ctx.emit1(OpCode.ADD, [ctx.emit1(OpCode.SQRT, [variance]), eps])
    return [ctx.emit1(OpCode.DIV, [ctx.emit1(OpCode.SUB, [x, mean]), std])]


def lp_norm(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """x / ||x||_p along `axis` (p = 1 or 2); 0 where the norm is 0."""
    x = node.input(0)
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise node.fail(f"p must be 1 or 2, got {p}")
    axis = int(node.attr("axis", -1))
    if p == 1:
        norm = ctx.emit1(OpCode.REDUCE_SUM, [ctx.emit1(OpCode.ABS, [x])], axes=[axis], keepdims=1)
    else:
        norm = ctx.emit1(
            OpCode.SQRT,
            [
                ctx.emit1(
                    OpCode.REDUCE_SUM, [ctx.emit1(OpCode.MUL, [x, x])], axes=[axis], keepdims=1
                )
            ],
        )
    zero = ctx.constant(f"{node.name}/zero", np.array(0, ctx.dtype(x)))
    is_zero = ctx.emit1(OpCode.EQUAL, [norm, zero])
    return [ctx.emit1(OpCode.WHERE, [is_zero, zero, ctx.emit1(OpCode.DIV, [x, norm])])]
