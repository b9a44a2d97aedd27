"""Gradients of the normalization backward kernels, BATCH_NORM_GRAD and LAYER_NORM_GRAD, so
that a network with batch or layer normalization has a second derivative.

Both kernels compute, per group of the reduced axes R (M elements), with xhat = (x - mean) r,
r = 1 / sqrt(var + eps) and gh = g scale:

    dbias = sum_B g,  dscale = sum_B g xhat,  dx = J(gh),
    J(w) = r (w - mean_R(w) - xhat mean_R(w xhat))

where B are the axes the scale is broadcast over (B = R for BatchNorm, the leading axes for
LayerNorm) and J is the Jacobian of xhat in x, which is symmetric. For cotangents
(a, c, b) of (dx, dscale, dbias) the vector-Jacobian product is

    d/dg     = scale J(a) + c xhat + b
    d/dscale = sum_B g J(a)
    d/dx     = J(c g - r S2 a - r mean_R(a xhat) gh) - r^2 k xhat,
               k = mean_R(a gh) - mean_R(a) S1 - mean_R(a xhat) S2,
               S1 = mean_R(gh), S2 = mean_R(gh xhat)

(d/dx differentiates xhat in dscale and r, xhat in dx). The statistics are recomputed from
x with ops that have rules, so the result can be differentiated again; the statistics
inputs of BATCH_NORM_GRAD (batch mean and inverse std, outputs of BATCH_NORM_TRAINING) are
functions of x that this gradient already follows, so they get none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.backward import _int, _number
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode

O = OpCode  # noqa: E741 - short, as in the declaration modules

Unary = Callable[[int], int]


@dataclass(frozen=True)
class _Norm:
    """How one normalization lays out its statistics and parameters."""

    axes: list[int]  # R: the axes each statistic is taken over
    spread: Unary  # a parameter-shaped tensor, made to broadcast against x
    sums: Unary  # an x-shaped tensor summed over B to the normalized (parameter) shape


def _ops(ctx: GradContext) -> tuple[Callable[..., int], Callable[..., int], Callable[..., int]]:
    mul = lambda a, b: ctx.op(O.MUL, [a, b])  # noqa: E731
    sub = lambda a, b: ctx.op(O.SUB, [a, b])  # noqa: E731
    add = lambda a, b: ctx.op(O.ADD, [a, b])  # noqa: E731
    return mul, sub, add


def _statistics(ctx: GradContext, x: int, axes: list[int], eps: float) -> tuple[int, int]:
    """(xhat, r) of x over `axes`, r keeping the reduced axes as ones."""
    mul, sub, add = _ops(ctx)
    mean = lambda t: ctx.op(O.REDUCE_MEAN, [t], axes=axes, keepdims=1)  # noqa: E731
    xc = sub(x, mean(x))
    var = mean(mul(xc, xc))
    r = ctx.op(O.RECIPROCAL, [ctx.op(O.SQRT, [add(var, ctx.scalar(eps, x))])])
    return mul(xc, r), r


def _sum_terms(ctx: GradContext, terms: list[int]) -> int:
    """The sum of `terms` (the first is x-shaped, so the sum is too)."""
    total = terms[0]
    for t in terms[1:]:
        total = ctx.op(O.ADD, [total, t])
    return total


def _vjp(
    ctx: GradContext,
    norm: _Norm,
    inputs: tuple[int, int, int],
    xhat: int,
    r: int,
    cots: list[int | None],
) -> tuple[int | None, int | None, int | None]:
    """(d/dg, d/dscale summed to the normalized shape, d/dx) as in the module docstring."""
    g, x, scale = inputs
    a, c, b = cots
    mul, sub, add = _ops(ctx)
    mean = lambda t: ctx.op(O.REDUCE_MEAN, [t], axes=norm.axes, keepdims=1)  # noqa: E731
    jac = lambda w: mul(r, sub(sub(w, mean(w)), mul(xhat, mean(mul(w, xhat)))))  # noqa: E731
    gamma = norm.spread(scale)
    ja = jac(a) if a is not None else None
    dg = dscale = dx = None
    if ctx.needs(g):
        terms = [ctx.op(O.MUL, [g, ctx.scalar(0.0, g)])] if ja is None and c is None else []
        terms += [mul(gamma, ja)] if ja is not None else []
        terms += [mul(norm.spread(c), xhat)] if c is not None else []
        terms += [norm.spread(b)] if b is not None else []
        dg = _sum_terms(ctx, terms)
    if ctx.needs(scale) and ja is not None:
        dscale = norm.sums(mul(g, ja))
    if ctx.needs(x) and (a is not None or c is not None):
        w_terms = [mul(norm.spread(c), g)] if c is not None else []
        correction = None
        if a is not None:
            gh = mul(g, gamma)
            s1, s2, ax = mean(gh), mean(mul(gh, xhat)), mean(mul(a, xhat))
            w_terms += [ctx.op(O.NEG, [mul(r, add(mul(s2, a), mul(ax, gh)))])]
            k = sub(sub(mean(mul(a, gh)), mul(mean(a), s1)), mul(ax, s2))
            correction = mul(mul(mul(r, r), k), xhat)
        dx = jac(_sum_terms(ctx, w_terms))
        if correction is not None:
            dx = sub(dx, correction)
    return dg, dscale, dx


def _channel_norm(ctx: GradContext, x: int) -> _Norm:
    """BatchNorm's layout: statistics over every axis but the channels (axis 1)."""
    rank = ctx.rank(x)
    axes = [0, *range(2, rank)]
    shape = [1, -1] + [1] * (rank - 2)
    return _Norm(
        axes,
        lambda t: ctx.op(O.RESHAPE, [t], shape=shape),
        lambda t: ctx.op(O.REDUCE_SUM, [t], axes=axes, keepdims=0),
    )


def batch_norm_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    g, x, scale = node.inputs[:3]
    if all(u is None for u in grads):
        return [None] * 5
    norm = _channel_norm(ctx, x)
    eps = _number(node, "epsilon", 1e-5)
    if not _int(node, "training", 1):
        return _frozen_batch_norm_grad(ctx, node, norm, grads, eps)
    xhat, r = _statistics(ctx, x, norm.axes, eps)
    dg, dscale, dx = _vjp(ctx, norm, (g, x, scale), xhat, r, list(grads))
    return [dg, dx, dscale, None, None]


def _frozen_batch_norm_grad(
    ctx: GradContext, node: Node, norm: _Norm, grads: list[int | None], eps: float
) -> list[int | None]:
    # dx = g scale r, dscale = sum g xhat, dbias = sum g, with the running statistics:
    # bilinear in g and (x, scale).
    g, x, scale, mean, var = node.inputs
    if ctx.needs(mean) or ctx.needs(var):
        raise UnsupportedOpError(
            f"BATCH_NORM_GRAD {node.name!r}: no gradient in the running statistics"
        )
    mul, sub, add = _ops(ctx)
    a, c, b = grads
    r = norm.spread(ctx.op(O.RECIPROCAL, [ctx.op(O.SQRT, [add(var, ctx.scalar(eps, var))])]))
    xhat = mul(sub(x, norm.spread(mean)), r)
    dg = dscale = dx = None
    if ctx.needs(g):
        terms = [ctx.op(O.MUL, [g, ctx.scalar(0.0, g)])] if a is None and c is None else []
        terms += [mul(mul(a, norm.spread(scale)), r)] if a is not None else []
        terms += [mul(norm.spread(c), xhat)] if c is not None else []
        terms += [norm.spread(b)] if b is not None else []
        dg = _sum_terms(ctx, terms)
    if ctx.needs(scale) and a is not None:
        dscale = norm.sums(mul(mul(a, g), r))
    if ctx.needs(x) and c is not None:
        dx = mul(mul(norm.spread(c), g), r)
    return [dg, dx, dscale, None, None]


def layer_norm_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    g, x, scale = node.inputs
    if all(u is None for u in grads):
        return [None] * 3
    rank = ctx.rank(x)
    axis = _int(node, "axis", -1) % rank
    axes, lead = list(range(axis, rank)), list(range(axis))
    norm = _Norm(
        axes,
        lambda t: t,  # the normalized shape broadcasts against x as it is
        lambda t: ctx.op(O.REDUCE_SUM, [t], axes=lead, keepdims=0) if lead else t,
    )
    eps = _number(node, "epsilon", 1e-5)
    xhat, r = _statistics(ctx, x, axes, eps)
    dg, dscale, dx = _vjp(ctx, norm, (g, x, scale), xhat, r, list(grads))
    if dscale is not None and ctx.shape(scale) != ctx.shape(x)[axis:]:
        dscale = ctx.op(O.REDUCE_SUM_TO, [dscale, scale])  # a scale broadcast over x
    return [dg, dx, dscale]
