"""Unary elementwise kernels and activations: Relu, Sigmoid, Silu, Tanh, Gelu, Erf, Exp, ...

Each kernel computes into the planner's `out` array with NumPy's `out=` ufunc arguments;
the few that need intermediates take temporaries in `bind` (lite/kernels/workspace.py),
never per run. Those make several passes over their data (erf: about twenty), so a large
tensor runs in blocks small enough that every pass over a block stays in the cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.activation import (
    bounds,
    clip_ufunc,
    exp_into,
    relu_into,
    relu_step,
    scalar,
    sigmoid_into,
    silu_into,
)
from sporenet.lite.kernels.base import (
    Attrs,
    ChannelsLast,
    Compute,
    Kernel,
    TensorSpec,
    required,
)
from sporenet.lite.kernels.quiet import quietly
from sporenet.lite.kernels.workspace import temporary, temporary_like
from sporenet.lite.ops import OpCode


class UnaryKernel(Kernel):
    """out = f(x), same shape and dtype; subclasses define `compute(x, out, *scratch)`."""

    float_only: ClassVar[bool] = True
    scratch: ClassVar[int] = 0  # how many x-shaped temporaries `compute` needs
    # Whether `compute` is ufuncs on x and out alone (no reshape), so either may be an
    # NCHW view of channels-last storage (see Kernel.channels_last_input). Every kernel
    # here is; a subclass that reshapes must set it False.
    any_layout: ClassVar[bool] = True
    elementwise = True

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0) if self.float_only else self.input(0)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        raise NotImplementedError

    def _layout(self) -> ChannelsLast:
        four = self.any_layout and len(self.output_specs[0].shape) == 4
        return ChannelsLast.ACCEPTED if four else ChannelsLast.REFUSED

    def channels_last_input(self, index: int) -> ChannelsLast:
        return self._layout() if index == 0 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return self._layout()

    def channels_last_follows(self, index: int) -> int | None:
        return 0 if self.any_layout else None

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, f = required(inputs, 0), outputs[0], self.compute
        if not self.scratch:
            return lambda: f(x, out)
        # Written before they are read on every call: temporaries from the plan's arena,
        # shared with the other steps, not private arrays per node.
        blocks = _blocks(x, out)
        if blocks is None:
            tmp = [temporary_like(out) for _ in range(self.scratch)]
            return lambda: f(x, out, *tmp)
        tmp = [temporary((BLOCK,), out.dtype) for _ in range(self.scratch)]
        parts = [(xb, ob, *(t[: xb.size] for t in tmp)) for xb, ob in blocks]

        def blockwise() -> None:
            for part in parts:
                f(*part)

        return blockwise


BLOCK = 32768
"""Elements per block of a multi-pass kernel: its input, output and temporaries (128 KiB
each in float32) stay in the L2 cache while the passes run."""


def _blocks(x: np.ndarray, out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """x and out as matching 1-D blocks of BLOCK elements in memory order, when there are
    several and both are dense with the same layout (C order, or the same NCHW view of
    channels-last memory); otherwise None."""
    if x.size <= 2 * BLOCK or x.shape != out.shape or x.strides != out.strides:
        return None
    order = sorted(range(x.ndim), key=lambda axis: -x.strides[axis])
    xf, of = x.transpose(order), out.transpose(order)
    if not (xf.flags.c_contiguous and of.flags.c_contiguous):
        return None
    xf, of = xf.reshape(-1), of.reshape(-1)
    return [(xf[i : i + BLOCK], of[i : i + BLOCK]) for i in range(0, xf.size, BLOCK)]


# --------------------------------------------------------------------------- activations


class Relu(UnaryKernel):
    op = OpCode.RELU

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        relu_into(x, out)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return relu_step(required(inputs, 0), outputs[0])


class Relu6(UnaryKernel):
    op = OpCode.RELU6

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        if x.dtype.kind == "f":
            clip_ufunc(x, *bounds(x.dtype, 0.0, 6.0), out=out)
        else:
            np.clip(x, 0, 6, out=out)


class Clip(UnaryKernel):
    """min(max(x, lo), hi); bounds from `min`/`max` attributes or optional inputs 1 and 2.

    Constant bound inputs are read at load time; non-constant ones are read at run time.
    """

    op = OpCode.CLIP
    num_inputs = (1, 3)
    float_only = False

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        self.bounds: list[float | None] = []
        self.dynamic: list[int] = []
        for k, name in ((1, "min"), (2, "max")):
            spec = self.optional_input(k)
            if spec is None:
                value = attrs.float(name)
                if value is not None and x.dtype.kind != "f":
                    if value != int(value):
                        raise self.fail(
                            f"attribute {name!r} = {value} is not a whole number "
                            f"for the {x.dtype} input"
                        )
                    value = int(value)  # an integer bound keeps an integer tensor's dtype
                self.bounds.append(value)
                continue
            if spec.size != 1:
                raise self.fail(
                    f"input {k} ({name}) must hold one value, got shape {list(spec.shape)}"
                )
            if spec.dtype != x.dtype:
                raise self.fail(f"input {k} ({name}) must be {x.dtype} like x, got {spec.dtype}")
            if spec.value is None:
                self.bounds.append(None)
                self.dynamic.append(k)
            else:
                self.bounds.append(spec.value.reshape(()).item())

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        low, high = self.bounds
        if not self.dynamic and self.input(0).dtype.kind == "f" and (low, high) != (None, None):
            # The clip ufunc with 0-d bounds of x's dtype (an infinite one for a missing
            # bound): maximum and minimum against a scalar run a scalar loop, several
            # times slower. clip computes min(max(x, lo), hi) too, so min > max gives max.
            source = required(inputs, 0)
            lo_f = -np.inf if low is None else low
            pair = bounds(out.dtype, lo_f, np.inf if high is None else high)

            def clipped() -> None:
                clip_ufunc(source, *pair, out=out)

            return clipped
        if self.dynamic:
            lo_c, hi_c = self.bounds
            lo = required(inputs, 1).reshape(()) if 1 in self.dynamic else lo_c
            hi = required(inputs, 2).reshape(()) if 2 in self.dynamic else hi_c
        else:
            lo, hi = self.bounds
        if lo is None and hi is None:
            return lambda: np.copyto(out, x)
        if lo is None:
            return lambda: np.minimum(x, hi, out=out)
        if hi is None:
            return lambda: np.maximum(x, lo, out=out)

        # ONNX clips to min first, then to max (so min > max yields max everywhere).
        def compute() -> None:
            np.maximum(x, lo, out=out)
            np.minimum(out, hi, out=out)

        return compute


class LeakyRelu(UnaryKernel):
    op = OpCode.LEAKY_RELU

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.alpha = attrs.float("alpha", 0.01)

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        # alpha*x is the smaller branch for x<0 when alpha <= 1, the larger one otherwise.
        np.multiply(x, self.alpha, out=out)
        if self.alpha <= 1:
            np.maximum(out, x, out=out)
        else:
            np.minimum(out, x, out=out)


class PRelu(Kernel):
    """x if x >= 0 else slope * x; slope broadcasts to x (ONNX unidirectional broadcasting)."""

    op = OpCode.PRELU
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        slope = self.input(1)
        if slope.dtype != x.dtype:
            raise self.fail(f"slope must be {x.dtype} like x, got {slope.dtype}")
        try:
            shape = np.broadcast_shapes(x.shape, slope.shape)
        except ValueError:
            shape = None
        if shape != x.shape:
            hint = (
                f" (for per-channel NCHW slopes use shape [{x.shape[1]}, 1, 1])"
                if x.rank == 4
                else ""
            )
            raise self.fail(
                f"slope of shape {list(slope.shape)} does not broadcast to x of "
                f"shape {list(x.shape)}{hint}"
            )
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    # Ufuncs on x and out alone (the slope broadcasts over either layout), so a PReLU
    # between depthwise layers keeps their channels-last storage.
    def _layout(self) -> ChannelsLast:
        four = len(self.output_specs[0].shape) == 4
        return ChannelsLast.ACCEPTED if four else ChannelsLast.REFUSED

    def channels_last_input(self, index: int) -> ChannelsLast:
        return self._layout() if index == 0 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return self._layout()

    def channels_last_follows(self, index: int) -> int | None:
        return 0

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, slope, out = required(inputs, 0), required(inputs, 1), outputs[0]
        known = self.input(1).value
        multiply = np.multiply
        # Slopes <= 1: slope*x is the larger branch for x < 0 and the smaller for x >= 0
        # (slopes >= 1: the other way round), so one extreme of the two gives the same
        # values in two passes. A zero's sign may differ from x's.
        pick: np.ufunc | None = None
        if known is not None and known.size and np.all(known <= 1):
            pick = np.maximum
        elif known is not None and known.size and np.all(known >= 1):
            pick = np.minimum
        if pick is not None:
            extreme = pick
            rows = _channels_last_rows([x, out], known)
            if rows is not None:
                (x, out), slope = rows

            def two_passes() -> None:
                multiply(x, slope, out=out)
                extreme(out, x, out=out)

            return two_passes
        if known is not None:
            return _mixed_slopes(x, out, known)
        return _runtime_slopes(x, slope, out)


def _runtime_slopes(x: np.ndarray, slope: np.ndarray, out: np.ndarray) -> Compute:
    """PReLU with a slope only known at run time: min(x, 0)*slope + max(x, 0), exact
    (one term is zero), in four passes."""
    negative = temporary_like(out)  # the scratch in out's layout
    # min(x, 0) and max(x, 0) as clips to (-inf, 0) and (0, inf): NumPy runs minimum
    # and maximum against a scalar in a scalar loop, clip in a vectorised one.
    below, above = bounds(out.dtype, -np.inf, 0.0), bounds(out.dtype, 0.0, np.inf)
    clip, multiply, add, copyto = clip_ufunc, np.multiply, np.add, np.copyto
    # x and out in different layouts (one channels-last): ufuncs reading across layouts
    # run far slower than one transposing copy, so the passes read out.
    copy_first = x.strides != out.strides
    source = out if copy_first else x

    def four_passes() -> None:
        if copy_first:
            copyto(out, x)
        clip(source, *below, out=negative)
        multiply(negative, slope, out=negative)
        clip(source, *above, out=out)
        add(out, negative, out=out)

    return four_passes


def _mixed_slopes(x: np.ndarray, out: np.ndarray, known: np.ndarray) -> Compute:
    """PReLU with constant slopes on both sides of 1: x + min(x, 0)*(slope - 1), three
    passes where the exact min(x, 0)*slope + max(x, 0) takes four.

    Within about an ulp of |x| of the exact value (the product and the sum each round
    once), and a NaN stays NaN; x = -inf gives NaN where slope*x is infinite. A
    channels-last tensor runs on rows of W*C elements in blocks of about _PRELU_BLOCK
    bytes, so the three passes over a block hit the cache."""
    # x and out in different layouts (one channels-last): ufuncs reading across layouts
    # run far slower than one transposing copy, so the passes read out.
    copy_first = x.strides != out.strides
    negative = temporary_like(out)  # the scratch in out's layout
    arrays = [out if copy_first else x, out, negative]
    rows = _channels_last_rows(arrays, known)
    less_one = known.astype(out.dtype) - out.dtype.type(1)
    if rows is not None:
        arrays, tiled = rows
        less_one = tiled - 1
    step = max(1, _PRELU_BLOCK // (arrays[0][0].nbytes or 1)) if rows is not None else 0
    blocks = [tuple(arrays)]
    if step and arrays[0].nbytes > 2 * _PRELU_BLOCK:
        blocks = [tuple(a[i : i + step] for a in arrays) for i in range(0, len(arrays[0]), step)]
    below = bounds(out.dtype, -np.inf, 0.0)
    clip, multiply, add, copyto = clip_ufunc, np.multiply, np.add, np.copyto

    def three_passes() -> None:
        if copy_first:
            copyto(out, x)
        for source, target, scratch in blocks:
            clip(source, *below, out=scratch)
            multiply(scratch, less_one, out=scratch)
            add(source, scratch, out=target)

    return three_passes


_PRELU_BLOCK = 256 << 10
"""Bytes of one block of a large channels-last PReLU (input, output and scratch each): the
three passes over it stay in the L2 cache (256 KiB blocks ran the 1.1 MiB layers of
palm_detection about 10% faster than one pass over the whole tensor at a time)."""


def _channels_last_rows(
    arrays: list[np.ndarray], slope: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray] | None:
    """The (N, C, H, W) `arrays`, all stored channels-last, as (N*H, W*C) rows, and the
    per-channel slope repeated along a row; else None.

    Broadcasting a per-channel slope along rows of C elements runs NumPy's slow strided
    loop; a row of W*C slopes keeps every operand contiguous."""
    n, c, h, w = arrays[0].shape if arrays[0].ndim == 4 else (0, 0, 0, 0)
    if not c or slope.size != c or slope.shape[-3:] != (c, 1, 1):
        return None
    rows = []
    for a in arrays:
        nhwc = a.transpose(0, 2, 3, 1)
        if a.flags.c_contiguous or not nhwc.flags.c_contiguous:
            return None
        rows.append(nhwc.reshape(n * h, w * c))
    return rows, np.tile(slope.reshape(c).astype(arrays[0].dtype), w)


class Sigmoid(UnaryKernel):
    op = OpCode.SIGMOID

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        sigmoid_into(x, out)


class Tanh(UnaryKernel):
    op = OpCode.TANH

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        np.tanh(x, out=out)


class HardSigmoid(UnaryKernel):
    """max(0, min(1, alpha * x + beta)) (ONNX defaults alpha=0.2, beta=0.5)."""

    op = OpCode.HARD_SIGMOID

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.alpha = attrs.float("alpha", 0.2)
        self.beta = attrs.float("beta", 0.5)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        # The ufuncs themselves with 0-d operands of x's dtype: Python-number operands
        # and np.clip's wrapper cost as much as the work on a squeeze-excite gate.
        return _affine_clip(required(inputs, 0), outputs[0], self.alpha, self.beta)


class HardSwish(UnaryKernel):
    """x * max(0, min(1, x / 6 + 1 / 2))."""

    op = OpCode.HARD_SWISH

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        gate = _affine_clip(x, out, 1 / 6, 0.5)
        multiply = np.multiply

        def compute() -> None:
            gate()
            multiply(out, x, out=out)

        return compute


def _affine_clip(x: np.ndarray, out: np.ndarray, alpha: float, beta: float) -> Compute:
    """The step out = clip(alpha * x + beta, 0, 1)."""
    a, b = scalar(x.dtype, alpha), scalar(x.dtype, beta)
    lo, hi = bounds(x.dtype, 0.0, 1.0)
    multiply, add, clip = np.multiply, np.add, clip_ufunc

    def compute() -> None:
        multiply(x, a, out=out)
        add(out, b, out=out)
        clip(out, lo, hi, out=out)

    return compute


class Silu(UnaryKernel):
    """x * sigmoid(x) (Swish with beta 1), as x / (1 + exp(-x)) computed in `out`."""

    op = OpCode.SILU

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        silu_into(x, out, out)


class Elu(UnaryKernel):
    """x if x > 0 else alpha * (exp(x) - 1)."""

    op = OpCode.ELU
    scratch = 1

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.alpha = attrs.float("alpha", 1.0)

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        (pos,) = scratch
        # alpha * expm1(min(x, 0)) is 0 where x > 0, so adding max(x, 0) selects the branch.
        # min(x, 0) as a clip: minimum against a scalar runs NumPy's scalar loop.
        clip_ufunc(x, *bounds(x.dtype, -np.inf, 0.0), out=out)
        np.expm1(out, out=out)
        out *= self.alpha
        relu_into(x, pos)
        out += pos


class Softplus(UnaryKernel):
    """log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)) so it never overflows."""

    op = OpCode.SOFTPLUS
    scratch = 1

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        (t,) = scratch
        np.abs(x, out=t)
        np.negative(t, out=t)
        np.exp(t, out=t)
        np.log1p(t, out=t)
        relu_into(x, out)
        out += t


# --------------------------------------------------------------------------- erf and gelu

# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t*(a1 + t*(a2 + ... + t*a5)) * exp(-z^2) for
# z >= 0 with t = 1 / (1 + p*z); absolute error below 1.5e-7. In float32 arithmetic the
# total error stays below 1e-6 (tests/unit/lite/test_kernels_unary.py measures it against
# math.erf). math.erf itself is scalar-only, and lite may not depend on SciPy.
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _horner_into(t: np.ndarray, coefficients: tuple[float, ...], out: np.ndarray) -> None:
    """out = t * (c1 + t * (c2 + ... + t * cn)) by Horner's rule, in place (out must not
    alias t): the polynomial shared by erf_into and gelu_into."""
    np.multiply(t, coefficients[-1], out=out)
    for c in reversed(coefficients[:-1]):
        out += c
        out *= t


def erf_into(z: np.ndarray, out: np.ndarray, t: np.ndarray, e: np.ndarray) -> None:
    """out = erf(z), vectorized; t and e are scratch arrays shaped like z (z may alias e)."""
    np.abs(z, out=t)
    t *= _ERF_P
    t += 1
    np.divide(1, t, out=t)  # as np.reciprocal, from the vectorised divide loop
    _horner_into(t, _ERF_A, out)
    # erf(|z|) = 1 - poly * exp(-z^2), then z's sign bit (erf is odd): integer and/xor on
    # the bits run several times faster than np.copysign.
    bits = np.dtype(f"u{z.dtype.itemsize}")
    sign = bits.type(1 << (8 * z.dtype.itemsize - 1))
    np.bitwise_and(z.view(bits), sign, out=t.view(bits))
    np.square(z, out=e)
    np.negative(e, out=e)
    np.exp(e, out=e)
    out *= e
    np.subtract(1, out, out=out)
    np.bitwise_xor(out.view(bits), t.view(bits), out=out.view(bits))


# GELU as 0.5 x + |x| (1/2 - Phi(-|x|)): relu(x) - |x| Phi(-|x|) without np.maximum (a
# tenth of a pass slower than a product) and without erf's sign bits. Phi(-a) =
# erfc(a / sqrt 2) / 2 from the same A&S form, with t = 1 / (1 + p a / sqrt 2) written as
# c s, s = 1 / (c + a), c = sqrt 2 / p: the factors c^k and the 1/2 go into the
# coefficients. The polynomial in s is then taken in r = k s with k^5 = -b5, which makes
# its negation monic in r (no first multiply in Horner's rule, and no 1/2 - q later:
# -q + 1/2 is one add), and -x/2 is made once for the exponent and the final term: the
# whole is eighteen passes instead of erf's twenty plus five.
_GELU_C = math.sqrt(2) / _ERF_P
_GELU_B = tuple(0.5 * a * _GELU_C ** (k + 1) for k, a in enumerate(_ERF_A))
_GELU_K = -(_GELU_B[-1] ** 0.2)
_GELU_MONIC = tuple(-b * _GELU_K ** -(k + 1) for k, b in enumerate(_GELU_B[:-1]))


def gelu_into(x: np.ndarray, out: np.ndarray, t: np.ndarray, e: np.ndarray, u: np.ndarray) -> None:
    """out = x Phi(x), the exact GELU, vectorized; t, e and u are scratch arrays shaped
    like x. Within 5e-7 of the float64 value at |x| <= 12; inf at +inf, nan at -inf and
    nan (as x * 0.5 * (1 + erf(x / sqrt 2)) computes them)."""
    np.abs(x, out=e)
    np.add(e, _GELU_C, out=t)
    np.divide(_GELU_K, t, out=t)  # r = k s
    np.add(t, _GELU_MONIC[-1], out=out)  # -polynomial, monic in r, by Horner's rule
    out *= t
    for c in reversed(_GELU_MONIC[:-1]):
        out += c
        out *= t
    np.multiply(x, -0.5, out=u)
    np.multiply(u, x, out=t)
    np.exp(t, out=t)
    out *= t  # -Phi(-|x|)
    out += 0.5
    out *= e
    out -= u


class Erf(UnaryKernel):
    op = OpCode.ERF
    scratch = 2

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        erf_into(x, out, scratch[0], scratch[1])


class Gelu(UnaryKernel):
    """x * Phi(x): exact erf form, or the tanh approximation with approximate="tanh"."""

    op = OpCode.GELU
    scratch = 3

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.approximate = attrs.str("approximate", "none")
        if self.approximate not in ("none", "tanh"):
            raise self.fail(
                f"attribute 'approximate' must be 'none' or 'tanh', got {self.approximate!r}"
            )

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        t, e, u = scratch
        if self.approximate == "tanh":
            # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
            np.square(x, out=t)
            t *= 0.044715
            t += 1
            t *= x
            t *= math.sqrt(2 / math.pi)
            np.tanh(t, out=out)
            out += 1
            out *= x
            out *= 0.5
        else:
            gelu_into(x, out, t, e, u)


# --------------------------------------------------------------------------- math


class Exp(UnaryKernel):
    op = OpCode.EXP

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        exp_into(x, out)


class Log(UnaryKernel):
    op = OpCode.LOG

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        quietly(np.log, x, out=out)  # log(0) = -inf, log(<0) = nan


class Sqrt(UnaryKernel):
    op = OpCode.SQRT

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        quietly(np.sqrt, x, out=out)  # sqrt(<0) = nan, as in ONNX


class Rsqrt(UnaryKernel):
    op = OpCode.RSQRT

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        if out.size == 1:
            # One positive number (a layer norm's statistic over a row): Python's float64
            # sqrt and division, rounded once to the dtype, cost a tenth of two ufunc calls.
            # Zero, negatives, NaN take the ufuncs for their IEEE results.
            v = x.item()
            if v > 0.0:
                out.fill(1.0 / math.sqrt(v))
                return
        quietly(_rsqrt, x, out)  # one quiet region for both: entering one costs a ufunc call


def _rsqrt(x: np.ndarray, out: np.ndarray) -> None:
    np.sqrt(x, out)
    np.reciprocal(out, out)


class Reciprocal(UnaryKernel):
    op = OpCode.RECIPROCAL

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        quietly(np.reciprocal, x, out=out)  # 1/0 = inf


# ---- plain ufuncs: one table, one kernel class per entry


class UfuncKernel(UnaryKernel):
    """out = ufunc(x) for a NumPy ufunc that needs no parameters or temporaries."""

    ufunc: ClassVar[np.ufunc]

    def compute(self, x: np.ndarray, out: np.ndarray, *scratch: np.ndarray) -> None:
        self.ufunc(x, out=out)


UFUNCS: dict[OpCode, tuple[str, np.ufunc, bool]] = {
    # op -> (class name, ufunc, whether integer tensors are accepted too)
    OpCode.NEG: ("Neg", np.negative, True),
    OpCode.ABS: ("Abs", np.abs, True),
    OpCode.FLOOR: ("Floor", np.floor, False),
    OpCode.CEIL: ("Ceil", np.ceil, False),
    OpCode.SQUARE: ("Square", np.square, True),
    OpCode.SIN: ("Sin", np.sin, False),  # TFLite's SIN and COS
    OpCode.COS: ("Cos", np.cos, False),
    OpCode.ROUND: ("Round", np.rint, False),  # ties to even (TFLite's ROUND)
    OpCode.SIGN: ("Sign", np.sign, True),
}


def _ufunc_kernel(op: OpCode, name: str, ufunc: np.ufunc, any_dtype: bool) -> type[UfuncKernel]:
    doc = f"out = numpy.{ufunc.__name__}(x) ({op.name})."
    attrs = {"op": op, "ufunc": ufunc, "float_only": not any_dtype, "__doc__": doc}
    return type(name, (UfuncKernel,), {**attrs, "__module__": __name__})


_UFUNC_KERNELS = {op: _ufunc_kernel(op, *entry) for op, entry in UFUNCS.items()}
Neg = _UFUNC_KERNELS[OpCode.NEG]
Abs = _UFUNC_KERNELS[OpCode.ABS]
Floor = _UFUNC_KERNELS[OpCode.FLOOR]
Ceil = _UFUNC_KERNELS[OpCode.CEIL]
Square = _UFUNC_KERNELS[OpCode.SQUARE]
Sin = _UFUNC_KERNELS[OpCode.SIN]
Cos = _UFUNC_KERNELS[OpCode.COS]
Round = _UFUNC_KERNELS[OpCode.ROUND]
Sign = _UFUNC_KERNELS[OpCode.SIGN]
