"""Gradients of activations and softmax.

ACTIVATION_GRAD(g, x, y) computes g * f'(x) for the activation named by the `activation`
attribute (with its parameters: alpha, clip_min/clip_max, approximate). Either x (the
activation's input) or y (its output) may be absent (-1): fused activations of
FullyConnected/Conv2D only have y, and relu, relu6, clip, leaky_relu, sigmoid and tanh
need nothing else. The others (hard_swish, silu, gelu, elu, softplus, hard_sigmoid, abs)
need x.

SOFTMAX_GRAD(g, y) is the gradient of Softmax (y = its output) or, with log=1, of
LogSoftmax (y = its output, the log-probabilities), along `axis`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sporenet.lite.kernels.activation import exp_into, sigmoid_into
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.unary import erf_into
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import Activation

Derivative = Callable[[np.ndarray], None]
"""Writes f'(.) of one activation into its argument."""


@dataclass(frozen=True)
class Params:
    """What a derivative reads: `t` (the activation's input x when `use_x`, else its output
    y), scratch arrays shaped like it, and the activation's attributes."""

    t: np.ndarray
    use_x: bool
    mask: np.ndarray
    tmp: np.ndarray
    alpha: float
    beta: float
    lo: float
    hi: float
    approximate: str


def _between(p: Params, lo: float, hi: float) -> Derivative:
    def d(out: np.ndarray) -> None:
        # Inside the linear range the slope is 1; at or beyond a bound it is 0.
        np.greater(p.t, lo, out=p.mask)
        np.copyto(out, p.mask)
        np.less(p.t, hi, out=p.mask)
        np.multiply(out, p.mask, out=out)

    return d


def _relu(p: Params) -> Derivative:
    def d(out: np.ndarray) -> None:
        np.greater(p.t, 0, out=p.mask)
        np.copyto(out, p.mask)

    return d


def _relu6(p: Params) -> Derivative:
    return _between(p, 0.0, 6.0)


def _clip(p: Params) -> Derivative:
    return _between(p, p.lo, p.hi)


def _leaky_relu(p: Params) -> Derivative:
    def d(out: np.ndarray) -> None:
        # Sign of y equals sign of x for a positive slope, so t may be either.
        np.greater(p.t, 0, out=p.mask)
        out.fill(p.alpha)
        out[p.mask] = 1

    return d


def _sigmoid(p: Params) -> Derivative:
    t, tmp = p.t, p.tmp

    def from_x(out: np.ndarray) -> None:
        sigmoid_into(t, out)
        np.subtract(1, out, out=tmp)
        np.multiply(out, tmp, out=out)

    def from_y(out: np.ndarray) -> None:
        np.subtract(1, t, out=out)
        np.multiply(out, t, out=out)

    return from_x if p.use_x else from_y


def _tanh(p: Params) -> Derivative:
    def d(out: np.ndarray) -> None:
        if p.use_x:
            np.tanh(p.t, out=p.tmp)
            np.square(p.tmp, out=out)
        else:
            np.square(p.t, out=out)
        np.subtract(1, out, out=out)

    return d


def _hard_swish(p: Params) -> Derivative:
    t, mask = p.t, p.mask

    def d(out: np.ndarray) -> None:
        # x * relu6(x + 3) / 6: slope (2x + 3) / 6 inside (-3, 3), 0 below, 1 above.
        np.multiply(t, 1 / 3, out=out)
        np.add(out, 0.5, out=out)
        np.less_equal(t, -3, out=mask)
        out[mask] = 0
        np.greater_equal(t, 3, out=mask)
        out[mask] = 1

    return d


def _silu(p: Params) -> Derivative:
    x, tmp = p.t, p.tmp

    def d(out: np.ndarray) -> None:
        # d/dx x s(x) = s(x) (1 + x (1 - s(x))), s(x) = 1 / (1 + exp(-x)); s saturates to 0
        # and 1 (exp to inf and 0), where the slope is 0 and 1.
        sigmoid_into(x, out)
        np.subtract(1, out, out=tmp)
        np.multiply(tmp, x, out=tmp)
        np.add(tmp, 1, out=tmp)
        np.multiply(out, tmp, out=out)

    return d


def _hard_sigmoid(p: Params) -> Derivative:
    t, mask, tmp, alpha, beta = p.t, p.mask, p.tmp, p.alpha, p.beta

    def d(out: np.ndarray) -> None:
        # Slope alpha where alpha x + beta lies strictly inside (0, 1), else 0.
        np.multiply(t, alpha, out=tmp)
        np.add(tmp, beta, out=tmp)
        np.greater(tmp, 0, out=mask)
        np.copyto(out, mask)
        np.less(tmp, 1, out=mask)
        np.multiply(out, mask, out=out)
        np.multiply(out, alpha, out=out)

    return d


def _elu(p: Params) -> Derivative:
    t, mask, alpha = p.t, p.mask, p.alpha

    def d(out: np.ndarray) -> None:
        np.minimum(t, 0, out=out)
        np.exp(out, out=out)
        np.multiply(out, alpha, out=out)
        np.greater(t, 0, out=mask)
        out[mask] = 1

    return d


def _softplus(p: Params) -> Derivative:
    def d(out: np.ndarray) -> None:
        np.negative(p.t, out=out)
        exp_into(out, out)
        np.add(out, 1, out=out)
        np.reciprocal(out, out=out)

    return d


def _abs(p: Params) -> Derivative:
    def d(out: np.ndarray) -> None:
        np.sign(p.t, out=out)  # 0 at 0, as PyTorch

    return d


def _gelu(p: Params) -> Derivative:
    x, tmp = p.t, p.tmp
    if p.approximate == "tanh":
        c = math.sqrt(2 / math.pi)

        def d_tanh(out: np.ndarray) -> None:
            # u = c (x + 0.044715 x^3); d/dx 0.5 x (1 + tanh u)
            #   = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) c (1 + 3 * 0.044715 x^2)
            x2 = np.square(x)
            u = c * (x + 0.044715 * x * x2)
            th = np.tanh(u)
            np.copyto(out, 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 0.134145 * x2))

        return d_tanh
    e, s = np.empty_like(tmp), np.empty_like(tmp)

    def d(out: np.ndarray) -> None:
        # Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
        np.multiply(x, 1 / math.sqrt(2), out=e)
        erf_into(e, out, tmp, s)
        np.add(out, 1, out=out)
        np.multiply(out, 0.5, out=out)
        np.square(x, out=tmp)
        np.multiply(tmp, -0.5, out=tmp)
        np.exp(tmp, out=tmp)
        np.multiply(tmp, x, out=tmp)
        np.multiply(tmp, 1 / math.sqrt(2 * math.pi), out=tmp)
        np.add(out, tmp, out=out)

    return d


# Activation name -> (builder of its derivative, whether the output y alone determines it).
DERIVATIVES: dict[str, tuple[Callable[[Params], Derivative], bool]] = {
    # functions of the output alone (fused activations keep only y)
    Activation.RELU: (_relu, True),
    Activation.RELU6: (_relu6, True),
    Activation.CLIP: (_clip, True),
    Activation.LEAKY_RELU: (_leaky_relu, True),
    Activation.SIGMOID: (_sigmoid, True),
    Activation.TANH: (_tanh, True),
    # functions of the input x
    Activation.HARD_SWISH: (_hard_swish, False),
    Activation.SILU: (_silu, False),
    Activation.GELU: (_gelu, False),
    Activation.ELU: (_elu, False),
    Activation.SOFTPLUS: (_softplus, False),
    Activation.HARD_SIGMOID: (_hard_sigmoid, False),
    Activation.ABS: (_abs, False),
}

DEFAULT_ALPHA: dict[str, float] = {Activation.ELU: 1.0, Activation.HARD_SIGMOID: 0.2}
"""`alpha` when the attribute is absent (0.01, leaky_relu's slope, for the others)."""

# Activations whose derivative is a function of the output alone ("none": the identity).
FROM_OUTPUT = frozenset({Activation.NONE} | {n for n, (_, y_only) in DERIVATIVES.items() if y_only})
FROM_INPUT = frozenset(n for n, (_, y_only) in DERIVATIVES.items() if not y_only)


class ActivationGrad(Kernel):
    """dx = g * f'(x) for a named activation; see the module docstring for which of x, y."""

    op = OpCode.ACTIVATION_GRAD
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g = self.require_float(0)
        x, y = self.optional_input(1), self.optional_input(2)
        self.name = attrs.str("activation", "none")
        if self.name not in FROM_OUTPUT | FROM_INPUT:
            raise self.fail(
                f"unknown activation {self.name!r}; expected one of "
                f"{sorted(FROM_OUTPUT | FROM_INPUT)}"
            )
        if x is None and y is None:
            raise self.fail("needs the activation's input x (input 1) or output y (input 2)")
        if x is None and self.name in FROM_INPUT:
            raise self.fail(
                f"the gradient of {self.name!r} needs the activation's input x "
                "(input 1), not only its output"
            )
        for spec in (x, y):
            if spec is not None and spec.shape != g.shape:
                raise self.fail(
                    f"x/y shape {list(spec.shape)} differs from the gradient's {list(g.shape)}"
                )
        self.use_x = x is not None and (self.name in FROM_INPUT or y is None)
        self.alpha = attrs.float("alpha", DEFAULT_ALPHA.get(self.name, 0.01))
        self.beta = attrs.float("beta", 0.5)
        self.lo = attrs.float("clip_min", -math.inf)
        self.hi = attrs.float("clip_max", math.inf)
        self.approximate = attrs.str("approximate", "none")
        self.output_specs = [TensorSpec(g.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, out = inputs[0], outputs[0]
        if self.name == "none":
            return lambda: np.copyto(out, g)
        t = inputs[1] if self.use_x else inputs[2]
        params = Params(
            t=t,
            use_x=self.use_x,
            mask=np.empty(out.shape, np.bool_),
            tmp=np.empty_like(out),
            alpha=self.alpha,
            beta=self.beta,
            lo=self.lo,
            hi=self.hi,
            approximate=self.approximate,
        )
        derivative = DERIVATIVES[self.name][0](params)

        def compute() -> None:
            derivative(out)
            np.multiply(out, g, out=out)

        return compute


class SoftmaxGrad(Kernel):
    """dx of Softmax (from its output y) or LogSoftmax (log=1, y = log-probabilities)."""

    op = OpCode.SOFTMAX_GRAD
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, y = self.require_float(0), self.require_float(1)
        if g.shape != y.shape:
            raise self.fail(f"gradient shape {list(g.shape)} differs from y's {list(y.shape)}")
        axis = attrs.int("axis", -1)
        if not -max(y.rank, 1) <= axis < max(y.rank, 1):
            raise self.fail(f"axis {axis} out of range for rank {y.rank}")
        self.axis = axis % max(y.rank, 1)
        self.log = bool(attrs.int("log", 0))
        self.output_specs = [TensorSpec(g.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, y, out, axis = inputs[0], inputs[1], outputs[0], self.axis
        reduced = list(out.shape)
        if reduced:
            reduced[axis] = 1
        s = np.empty(reduced, out.dtype)
        if self.log:

            def compute_log() -> None:
                # d logsoftmax: g - softmax * sum(g)
                np.sum(g, axis=axis, keepdims=True, out=s)
                np.exp(y, out=out)
                np.multiply(out, s, out=out)
                np.subtract(g, out, out=out)

            return compute_log

        def compute() -> None:
            # d softmax: y * (g - sum(g * y))
            np.multiply(g, y, out=out)
            np.sum(out, axis=axis, keepdims=True, out=s)
            np.subtract(g, s, out=out)
            np.multiply(out, y, out=out)

        return compute
