"""Gradients of the backward kernels, so that a gradient graph can be differentiated again
(grad(grad(f)), Hessian-vector products).

Each backward kernel (lite/kernels/training/) is linear in the incoming gradient g, so its
gradient with respect to g is its adjoint (the forward op for a transposed one, the
backward kernel itself for a self-adjoint one); with respect to the forward values it
reads, it is the derivative of f' written with ops that have rules themselves, so the
result can be differentiated a third time.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules.conv import conv_from, window_attrs
from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.graph import Node
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import FROM_OUTPUT, Activation

O = OpCode  # noqa: E741 - short, as in the declaration modules


def _number(node: Node, key: str, default: float) -> float:
    value = node.attrs.get(key, default)
    if not isinstance(value, int | float):
        raise ShapeError(f"{node.op.name} {node.name!r}: attribute {key!r} must be a number")
    return value


def _int(node: Node, key: str, default: int) -> int:
    return int(_number(node, key, default))


def _ints(node: Node, key: str) -> list[int]:
    value = node.attrs.get(key, [])
    if not isinstance(value, list | tuple) or not all(isinstance(v, int) for v in value):
        raise ShapeError(f"{node.op.name} {node.name!r}: attribute {key!r} must list ints")
    return [int(v) for v in value]


def _batch_sum(ctx: GradContext, grad: int, like: int, out: int) -> int:
    """`grad` summed to `like`'s shape where a matmul broadcast it over batch axes."""
    if ctx.shape(like)[:-2] == ctx.shape(out)[:-2]:
        return grad
    return ctx.op(O.REDUCE_SUM_TO, [grad, like])


def matmul_transposed(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # out = A @ B with A = op(a), B = op(b): dA = u @ B^T and dB = A^T @ u, each transposed
    # back where the operand was.
    a, b = node.inputs
    (u,) = grads
    if u is None:
        return [None, None]
    ta, tb = _int(node, "transpose_a", 0), _int(node, "transpose_b", 0)
    out = node.outputs[0]
    da = db = None
    if ctx.needs(a):
        if ta:
            da = ctx.op(O.MATMUL_TRANSPOSED, [b, u], transpose_a=tb, transpose_b=1)
        else:
            da = ctx.op(O.MATMUL_TRANSPOSED, [u, b], transpose_b=1 - tb)
        da = _batch_sum(ctx, da, a, out)
    if ctx.needs(b):
        if tb:
            db = ctx.op(O.MATMUL_TRANSPOSED, [u, a], transpose_a=1, transpose_b=ta)
        else:
            db = ctx.op(O.MATMUL_TRANSPOSED, [a, u], transpose_a=1 - ta)
        db = _batch_sum(ctx, db, b, out)
    return [da, db]


def reduce_sum_to(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Summing over broadcast axes is the adjoint of broadcasting: spread u back.
    g, target = node.inputs
    (u,) = grads
    shape, small = ctx.shape(g), ctx.shape(target)
    lead = len(shape) - len(small)
    axes = [k for k in range(len(shape)) if k < lead or (small[k - lead] == 1 and shape[k] != 1)]
    if u is None or not axes:
        return [u, None]
    return [ctx.op(O.REDUCE_GRAD, [u, g], axes=axes, keepdims=1, reduction="sum"), None]


def reduce_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Spreading g over the reduced axes (divided by their size for a mean) is the adjoint
    # of the reduction itself.
    g, x = node.inputs
    (u,) = grads
    if u is None:
        return [None, None]
    reduction = str(node.attrs.get("reduction", "sum"))
    op = O.REDUCE_MEAN if reduction == "mean" else O.REDUCE_SUM
    keepdims = _int(node, "keepdims", 1)
    rank = ctx.rank(x)
    axes = sorted({a % rank for a in _ints(node, "axes")}) or list(range(rank))
    du = ctx.op(op, [u], axes=axes, keepdims=keepdims)
    shape = ctx.shape(x)
    reduced = [1 if k in axes else d for k, d in enumerate(shape)]
    if not keepdims:
        reduced = [d for k, d in enumerate(shape) if k not in axes]
    if list(ctx.shape(g)) != reduced and ctx.shape(g).count(-1) <= 1:
        du = ctx.op(O.RESHAPE, [du], shape=list(ctx.shape(g)))  # g stored in another shape
    return [du, None]


def _mask(ctx: GradContext, x: int, lo: float | None, hi: float | None) -> int:
    """1.0 where lo < x < hi, else 0.0 (a float tensor shaped like x)."""
    parts = []
    if lo is not None:
        parts.append(ctx.op(O.GREATER, [x, ctx.scalar(lo, x)]))
    if hi is not None:
        parts.append(ctx.op(O.LESS, [x, ctx.scalar(hi, x)]))
    floats = [ctx.op(O.CAST, [p], to=str(ctx.dtype(x))) for p in parts]
    return floats[0] if len(floats) == 1 else ctx.op(O.MUL, floats)


def _second_derivative(ctx: GradContext, node: Node, name: Activation) -> int | None:
    """f'' of the activation, as a function of x, or of y = f(x) for FROM_OUTPUT ones
    (then d f'(y) / dy); None where it is zero almost everywhere."""
    x, y = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else -1
    mul, sub = (lambda a, b: ctx.op(O.MUL, [a, b])), (lambda a, b: ctx.op(O.SUB, [a, b]))
    if name == Activation.SIGMOID:  # f' = y (1 - y): d/dy = 1 - 2y
        return sub(ctx.scalar(1.0, y), ctx.scale(y, 2.0, y))
    if name == Activation.TANH:  # f' = 1 - y^2: d/dy = -2y
        return ctx.scale(y, -2.0, y)
    if name in (Activation.SILU, Activation.SOFTPLUS):
        s = ctx.op(O.SIGMOID, [x])
        ds = mul(s, sub(ctx.scalar(1.0, x), s))  # s' = s (1 - s)
        if name == Activation.SOFTPLUS:  # f' = s
            return ds
        # f' = s + x s': f'' = 2 s' + x s' (1 - 2 s)
        curve = mul(x, sub(ctx.scalar(1.0, x), ctx.scale(s, 2.0, x)))
        return mul(ds, ctx.op(O.ADD, [ctx.scalar(2.0, x), curve]))
    if name == Activation.GELU:
        if str(node.attrs.get("approximate", "none")) != "none":
            raise UnsupportedOpError(
                f"ACTIVATION_GRAD {node.name!r}: no second derivative of the tanh GELU"
            )
        # f' = Phi + x phi: f'' = phi (2 - x^2), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
        x2 = mul(x, x)
        phi = ctx.scale(ctx.op(O.EXP, [ctx.scale(x2, -0.5, x)]), 0.3989422804014327, x)
        return mul(phi, sub(ctx.scalar(2.0, x), x2))
    if name == Activation.ELU:  # alpha e^x for x < 0
        alpha = float(_number(node, "alpha", 1.0))
        below = _mask(ctx, x, None, 0.0)
        return mul(below, ctx.scale(ctx.op(O.EXP, [x]), alpha, x))
    if name == Activation.HARD_SWISH:  # f' = (2x + 3) / 6 on (-3, 3): f'' = 1/3 there
        return ctx.scale(_mask(ctx, x, -3.0, 3.0), 1.0 / 3.0, x)
    if name in _PIECEWISE_LINEAR:
        return None
    raise UnsupportedOpError(
        f"ACTIVATION_GRAD {node.name!r}: no second derivative of {name.value!r} "
        "(lite/autodiff/rules/backward.py)"
    )


_PIECEWISE_LINEAR = frozenset(
    {
        Activation.NONE,
        Activation.RELU,
        Activation.RELU6,
        Activation.CLIP,
        Activation.LEAKY_RELU,
        Activation.HARD_SIGMOID,
        Activation.ABS,
    }
)


def activation_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # dx = g f'(v), v = x or y: linear in g (its adjoint is itself), and d/dv = g f''(v).
    g = node.inputs[0]
    (u,) = grads
    out: list[int | None] = [None] * len(node.inputs)
    if u is None:
        return out
    name = Activation(str(node.attrs.get("activation", "none")))
    if ctx.needs(g):
        out[0] = ctx.op(O.ACTIVATION_GRAD, [u, *node.inputs[1:]], **node.attrs)
    at = 2 if name in FROM_OUTPUT else 1
    if at < len(node.inputs) and ctx.needs(node.inputs[at]):
        curve = _second_derivative(ctx, node, name)
        if curve is not None:
            out[at] = ctx.op(O.MUL, [ctx.op(O.MUL, [u, g]), curve])
    return out


def softmax_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # softmax: dx = y (g - s), s = sum(g y); log-softmax: dx = g - p sum(g), p = exp(y).
    g, y = node.inputs
    (u,) = grads
    if u is None:
        return [None, None]
    axis = _int(node, "axis", -1)
    total = lambda t: ctx.op(O.REDUCE_SUM, [t], axes=[axis], keepdims=1)  # noqa: E731
    mul, sub = (lambda a, b: ctx.op(O.MUL, [a, b])), (lambda a, b: ctx.op(O.SUB, [a, b]))
    dg = dy = None
    if _int(node, "log", 0):
        p = ctx.op(O.EXP, [y])
        if ctx.needs(g):
            dg = sub(u, total(mul(u, p)))
        if ctx.needs(y):
            dy = ctx.op(O.NEG, [mul(mul(u, p), total(g))])
        return [dg, dy]
    if ctx.needs(g):
        dg = ctx.op(O.SOFTMAX_GRAD, [u, y], axis=axis)
    if ctx.needs(y):
        dy = sub(mul(u, sub(g, total(mul(g, y)))), mul(g, total(mul(u, y))))
    return [dg, dy]


# (role of input 0, role of input 1, role of the output) among a convolution's x, w, y
_CONV_ROLES = {
    O.CONV2D_BACKPROP_INPUT: ("y", "w", "x"),
    O.CONV2D_BACKPROP_FILTER: ("y", "x", "w"),
}


def conv2d_backprop(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Both backprop kernels are bilinear in their first two inputs: the gradient in each is
    # the kernel computing that input's role from the cotangent (in the output's role) and
    # the other input, e.g. for dx = conv^T(g, w): d/dg = conv(u, w), d/dw = filter(g, u).
    # A filter gradient's second output (the bias gradient, g summed over N, H, W) gives
    # g its cotangent broadcast back over those axes.
    first, second, result = _CONV_ROLES[node.op]
    u, ub = grads[0], grads[1] if len(grads) > 1 else None
    out: list[int | None] = [None] * len(node.inputs)
    a, b = node.inputs[:2]
    attrs = window_attrs(node)
    if u is not None and ctx.needs(a):
        out[0] = conv_from(ctx, first, {result: u, second: b}, a, attrs)
    if u is not None and ctx.needs(b):
        out[1] = conv_from(ctx, second, {result: u, first: a}, b, attrs)
    if ub is not None and ctx.needs(a):
        spread = ctx.op(O.REDUCE_GRAD, [ub, a], axes=[0, 2, 3], keepdims=0, reduction="sum")
        out[0] = spread if out[0] is None else ctx.op(O.ADD, [out[0], spread])
    return out


def avg_pool2d_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Spreading g over the windows is the adjoint of averaging them.
    (u,) = grads
    if u is None:
        return [None, None]
    return [ctx.op(O.AVG_POOL2D, [u], **node.attrs), None]


def _mean_scale(ctx: GradContext, g: int, like: int) -> int:
    """g / size(like), spread to like's shape (the size may follow the batch)."""
    axes = list(range(ctx.rank(like)))
    return ctx.op(O.REDUCE_GRAD, [g, like], axes=axes, keepdims=0, reduction="mean")


def _per_unit_gradient(ctx: GradContext, node: Node, u: int) -> int:
    """d loss-gradient / d g: the kernel at g = 1 dotted with u (a scalar like g)."""
    g = node.inputs[0]
    shape = list(ctx.shape(g))
    one = ctx.scalar(1.0, g)
    if shape:
        one = ctx.op(O.RESHAPE, [one], shape=shape)
    unit = ctx.op(node.op, [one, *node.inputs[1:]], **node.attrs)
    dot = ctx.op(O.REDUCE_SUM, [ctx.op(O.MUL, [u, unit])], keepdims=0)
    return ctx.op(O.RESHAPE, [dot], shape=shape) if shape else dot


def mse_loss_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # d = g 2 (p - t) / size: d/dp = 2 g u / size, d/dt = -d/dp.
    g, p, t = node.inputs
    (u,) = grads
    if u is None:
        return [None, None, None]
    dg = _per_unit_gradient(ctx, node, u) if ctx.needs(g) else None
    dp = ctx.op(O.MUL, [u, _mean_scale(ctx, ctx.scale(g, 2.0, g), p)])
    return [dg, dp if ctx.needs(p) else None, ctx.op(O.NEG, [dp]) if ctx.needs(t) else None]


def bce_with_logits_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # d = g (sigmoid(x) - t) / size: d/dx = g u s (1 - s) / size.
    g, x, t = node.inputs
    (u,) = grads
    if u is None:
        return [None, None, None]
    if ctx.needs(t):
        raise UnsupportedOpError(f"BCE_WITH_LOGITS_GRAD {node.name!r}: no gradient in targets")
    dg = _per_unit_gradient(ctx, node, u) if ctx.needs(g) else None
    s = ctx.op(O.SIGMOID, [x])
    ds = ctx.op(O.MUL, [s, ctx.op(O.SUB, [ctx.scalar(1.0, x), s])])
    dx = ctx.op(O.MUL, [ctx.op(O.MUL, [u, ds]), _mean_scale(ctx, g, x)])
    return [dg, dx if ctx.needs(x) else None, None]


def softmax_cross_entropy_grad(
    ctx: GradContext, node: Node, grads: list[int | None]
) -> list[int | None]:
    # d = g (p - target) / N over N rows of C classes: d/dp = g u / N = g u C / size.
    g, p = node.inputs[:2]
    (u,) = grads
    if u is None:
        return [None, None, None]
    classes = ctx.shape(p)[-1]
    if ctx.needs(p) and classes == -1:
        raise UnsupportedOpError(
            f"SOFTMAX_CROSS_ENTROPY_GRAD {node.name!r}: a second derivative needs a known "
            "number of classes"
        )
    dg = _per_unit_gradient(ctx, node, u) if ctx.needs(g) else None
    dp = None
    if ctx.needs(p):
        dp = ctx.op(O.MUL, [u, _mean_scale(ctx, ctx.scale(g, float(classes), g), p)])
    return [dg, dp, None]


def max_pool2d_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # dx routes g to each window's first maximum: linear in g, whose adjoint reads u at the
    # same taps; the routing is piecewise constant in x and y, so they get no gradient.
    # A folded ReLU (relu=1) masks g by y > 0, so the adjoint masks its output alike.
    # A routing mask (input 3) routes as the walk over x and y does: the adjoint reads those.
    (u,) = grads
    nothing: list[int | None] = [None] * len(node.inputs)
    if u is None or not ctx.needs(node.inputs[0]):
        return nothing
    select = ctx.op(O.MAX_POOL2D_SELECT, [u, *node.inputs[1:3]], **node.attrs)
    return [select, *nothing[1:]]


def max_pool2d_select(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # The adjoint of MAX_POOL2D_GRAD is MAX_POOL2D_GRAD itself.
    (u,) = grads
    if u is None or not ctx.needs(node.inputs[0]):
        return [None, None, None]
    return [ctx.op(O.MAX_POOL2D_GRAD, [u, *node.inputs[1:]], **node.attrs), None, None]


def slice_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Writing g into a region of zeros is the adjoint of slicing that region.
    (u,) = grads
    if u is None or not ctx.needs(node.inputs[0]):
        return [None, None]
    return [ctx.op(O.SLICE, [u], **node.attrs), None]


def pad_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Cropping the padding off g is the adjoint of padding with zeros.
    (u,) = grads
    if u is None or not ctx.needs(node.inputs[0]):
        return [None, None]
    return [ctx.op(O.PAD, [u], **{**node.attrs, "value": 0.0}), None]


def gather_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # Scatter-adding g at the indices is the adjoint of gathering them.
    (u,) = grads
    if u is None or not ctx.needs(node.inputs[0]):
        return [None, None, None]
    axis = _int(node, "axis", 0)
    return [ctx.op(O.GATHER, [u, node.inputs[1]], axis=axis), None, None]


def fake_quant_grad(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    # dx = g inside the range, dmin / dmax sum g below / above it: linear in g, piecewise
    # constant in x and the range. The adjoint gives u_x inside the range and the range
    # gradients' cotangents (broadcast) outside it: with t = u_min below the midpoint of
    # the range and u_max above it, FAKE_QUANT_GRAD(u_x - t) + t.
    g, x = node.inputs[:2]
    out: list[int | None] = [None] * len(node.inputs)
    if not ctx.needs(g) or all(u is None for u in grads):
        return out
    ux = grads[0] if grads[0] is not None else ctx.op(O.MUL, [g, ctx.scalar(0.0, g)])
    if len(node.inputs) == 4 and any(u is not None for u in grads[1:]):
        lo, hi = node.inputs[2:]
        shape = [1] * ctx.rank(x)
        if int(np.prod(ctx.shape(lo))) != 1:  # per-channel ranges, along `axis`
            shape[_int(node, "axis", -1) % ctx.rank(x)] = -1
        spread = lambda t: ctx.op(O.RESHAPE, [t], shape=shape)  # noqa: E731
        mid = spread(ctx.scale(ctx.op(O.ADD, [lo, hi]), 0.5, lo))
        below = ctx.op(O.CAST, [ctx.op(O.LESS, [x, mid])], to=str(ctx.dtype(x)))
        parts = []
        if grads[1] is not None:
            parts.append(ctx.op(O.MUL, [spread(grads[1]), below]))
        if grads[2] is not None:
            above = ctx.op(O.SUB, [ctx.scalar(1.0, x), below])
            parts.append(ctx.op(O.MUL, [spread(grads[2]), above]))
        t = parts[0] if len(parts) == 1 else ctx.op(O.ADD, parts)
        inside = ctx.op_multi(
            O.FAKE_QUANT_GRAD, [ctx.op(O.SUB, [ux, t]), *node.inputs[1:]], 3, **node.attrs
        )
        out[0] = ctx.op(O.ADD, [inside[0], t])
    else:
        outs = len(node.outputs)
        out[0] = ctx.op_multi(O.FAKE_QUANT_GRAD, [ux, *node.inputs[1:]], outs, **node.attrs)[0]
    return out
