"""Gradients of BatchNorm (inference and training forms) and LayerNorm
(kernels: lite/kernels/normalization.py, layer_norm.py; backward: training/norm_grad.py)."""

from __future__ import annotations

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.backward import _number
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode


def _only_first_output(node: Node, grads: list[int | None]) -> None:
    if any(g is not None for g in grads[1:]):
        raise UnsupportedOpError(
            f"{node.op.name} {node.name!r}: no gradient through its statistics outputs"
        )


def batch_norm(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Inference form: frozen running statistics, y = scale * (x - mean) * invstd + bias.
    x, scale, _, mean, var = node.inputs
    _only_first_output(node, grads)
    dx, dscale, dbias = ctx.op_multi(
        OpCode.BATCH_NORM_GRAD,
        [grads[0], x, scale, mean, var],
        3,
        training=0,
        epsilon=_number(node, "epsilon", 1e-5),
    )
    return [dx, dscale, dbias, None, None]


def batch_norm_training(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    x, scale = node.inputs[:2]
    _only_first_output(node, grads)
    mean, invstd = node.outputs[1:3]
    dx, dscale, dbias = ctx.op_multi(
        OpCode.BATCH_NORM_GRAD,
        [grads[0], x, scale, mean, invstd],
        3,
        training=1,
        epsilon=_number(node, "epsilon", 1e-5),  # recomputes them in a 2nd derivative
    )
    return [dx, dscale, dbias, None, None]


def layer_norm(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    x, scale = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 else -1
    _only_first_output(node, grads)
    attrs = {k: node.attrs[k] for k in ("axis", "epsilon") if k in node.attrs}
    dx, dscale, dbias = ctx.op_multi(OpCode.LAYER_NORM_GRAD, [grads[0], x, scale], 3, **attrs)
    # The kernel returns parameter gradients with the normalized shape x.shape[axis:];
    # scale and bias may be smaller and broadcast.
    axis = int(node.attrs.get("axis", -1)) % ctx.rank(x)
    normalized = ctx.shape(x)[axis:]
    if ctx.needs(scale) and ctx.shape(scale) != normalized:
        dscale = ctx.op(OpCode.REDUCE_SUM_TO, [dscale, scale])
    if ctx.needs(bias) and ctx.shape(bias) != normalized:
        dbias = ctx.op(OpCode.REDUCE_SUM_TO, [dbias, bias])
    return [dx, dscale, dbias][: len(node.inputs)]
