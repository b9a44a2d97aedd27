"""Fused activations: the in-place functions Conv2D and FullyConnected apply to their output.

The same names are used by the `activation` attribute in model files and by the converter's
activation-fusion pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np

from sporenet.lite.errors import ShapeError
from sporenet.lite.kernels.quiet import quietly
from sporenet.lite.kernels.workspace import Late, temporary, temporary_after
from sporenet.lite.opset.decl import Activation

InPlace = Callable[[np.ndarray], None]


def then_activation(
    step: Callable[[], None], out: np.ndarray, act: InPlace | None
) -> Callable[[], None]:
    """`step` followed by the fused activation `act` on its output `out` (in place); `step`
    itself when there is none, so the run-time step never tests for it."""
    if act is None:
        return step
    activate = bound_activation(act, out, last=True)

    def activated() -> None:
        step()
        activate()

    return activated


def bound_activation(act: InPlace, out: np.ndarray, *, last: bool = False) -> Callable[[], None]:
    """The step applying the fused activation `act` to `out` in place; a RELU's route is
    chosen here, once (relu_step), not on every call, and an activation needing scratch
    takes it from the arena (scratched; `last` as there)."""
    if act is _relu:
        return relu_step(out, out)
    bound = scratched(act, out, last=last)
    return lambda: bound(out)


# The clip ufunc itself: np.clip is a Python wrapper around it whose overhead is as much
# as the whole operation on the small tensors of an MLP. Older or newer
# NumPy without this private path gets np.clip (same results).
_clip = getattr(getattr(getattr(np, "_core", None), "umath", None), "clip", None)
if not isinstance(_clip, np.ufunc):
    _clip = np.clip


def _bounds(dtype: np.dtype, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """0-d arrays of `dtype` holding lo and hi, made once per (dtype, lo, hi).

    clip converts Python-number bounds on every call; 0-d arrays of the tensor's own
    dtype skip that conversion, a visible share of the time on small tensors.
    """
    key = (dtype, lo, hi)
    pair = _BOUNDS.get(key)
    if pair is None:
        pair = _BOUNDS[key] = (np.array(lo, dtype), np.array(hi, dtype))
    return pair


_BOUNDS: dict[tuple[np.dtype, float, float], tuple[np.ndarray, np.ndarray]] = {}
bounds = _bounds  # shared with the standalone activation kernels (unary.py)
clip_ufunc = _clip


def relu_into(x: np.ndarray, out: np.ndarray) -> None:
    """out = max(x, 0), by the fastest NumPy route for the size (shared with the Relu op)."""
    # NumPy 2.x runs maximum against a scalar in a scalar loop: several times slower than
    # clip's vectorised one on large tensors, but a little cheaper to call on tiny ones (an
    # MLP's hidden layer), against a 0-d zero (a Python 0 costs a conversion per call).
    # Both give the same values (NaN propagates; clip keeps -0.0).
    if x.size > _SMALL:
        if x.dtype.kind == "f":
            lo, hi = _bounds(x.dtype, 0.0, np.inf)
            _clip(x, lo, hi, out=out)
        else:  # an integer tensor: max(x, 0) of its own dtype (an inf bound cannot cast)
            np.maximum(x, x.dtype.type(0), out=out)
    else:
        np.maximum(x, _scalar(x.dtype, 0) if x.dtype.kind == "f" else 0, out=out)


def relu_step(x: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """The step out = max(x, 0): relu_into with its route chosen once, when bound (on a
    wake-word head's short rows the checks and the extra call level cost as much as the
    maximum itself)."""
    if x.size > _SMALL or x.dtype.kind != "f":
        return lambda: relu_into(x, out)
    zero, maximum = _scalar(x.dtype, 0.0), np.maximum

    def relu() -> None:
        maximum(x, zero, out=out)

    return relu


def _relu(x: np.ndarray) -> None:
    relu_into(x, x)


_SMALL = 1024


def _relu6(x: np.ndarray) -> None:
    if x.dtype.kind != "f":  # integer tensors keep the Python-number bounds
        _clip(x, 0, 6, out=x)
        return
    lo, hi = _bounds(x.dtype, 0.0, 6.0)
    _clip(x, lo, hi, out=x)


def exp_into(x: np.ndarray, out: np.ndarray) -> None:
    """exp(x) into `out`, saturating to inf without NumPy's overflow warning: inf is the
    exact IEEE result, and the formulas built on it (1 / (1 + exp(-x))) need it."""
    quietly(np.exp, x, out=out)


def sigmoid_into(x: np.ndarray, out: np.ndarray) -> None:
    """1 / (1 + exp(-x)) into `out` (which may be `x`). The division by 1 is
    np.reciprocal's correctly rounded result, from NumPy's vectorised divide loop."""
    if out.size == 1 and out.dtype.kind == "f":
        out.fill(sigmoid_of(x.item()))
        return
    one = _scalar(out.dtype, 1.0) if out.dtype.kind == "f" else 1
    np.negative(x, out=out)
    exp_into(out, out)
    np.add(out, one, out=out)
    np.divide(one, out, out=out)


def sigmoid_of(v: float) -> float:
    """1 / (1 + exp(-v)) of one number, in Python's float64: for a one-element tensor (a
    classifier's final probability) the four ufunc calls of the array form cost ten
    times more. Rounded once to the tensor's dtype, it is within half an ulp of the
    exact value; NaN stays NaN, and exp(-v) past float64's range gives 0 as the array
    form's inf does."""
    try:
        return 1.0 / (1.0 + math.exp(-v))
    except OverflowError:
        return 0.0


def _sigmoid(x: np.ndarray) -> None:
    sigmoid_into(x, x)


def _tanh(x: np.ndarray) -> None:
    np.tanh(x, out=x)


def _hard_swish(x: np.ndarray) -> None:
    if x.dtype.kind != "f":
        x *= np.clip(x + 3, 0, 6) * (1 / 6)
        return
    _hard_swish_into(x, np.empty_like(x))


def _hard_swish_into(x: np.ndarray, gate: np.ndarray) -> None:
    """x *= clip(x + 3, 0, 6) / 6 in place, `gate` a float scratch shaped like x, with no
    Python-number conversions."""
    np.add(x, _scalar(x.dtype, 3.0), out=gate)
    lo, hi = _bounds(x.dtype, 0.0, 6.0)
    _clip(gate, lo, hi, out=gate)
    np.multiply(x, gate, out=x)
    np.multiply(x, _scalar(x.dtype, 1 / 6), out=x)


def silu_into(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
    """out = x * sigmoid(x), computed as x / (1 + exp(-x)): one division instead of a
    reciprocal and a product. `t` is a scratch array shaped like x; it may be `out` when
    `out` is not `x`. exp(-x) saturates to inf for very negative x, giving -0.0 as
    x * sigmoid(x) does; x = -inf gives NaN, as x * sigmoid(x) does (-inf * 0)."""
    quietly(_silu_steps, x, out, t)  # one quiet region: entering one costs a ufunc call


def _silu_steps(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
    """silu_into's passes, run where exp's overflow (inf: the exact IEEE result) and
    -inf / inf (NaN, the product form's result) raise no warning."""
    np.negative(x, t)
    np.exp(t, t)
    np.add(t, _scalar(t.dtype, 1.0), t)
    np.divide(x, t, out)


def _silu(x: np.ndarray) -> None:
    # Outside a bound step (with_scratch), a fresh x-sized temporary: faster than looping
    # over chunks of x with a small fixed scratch.
    silu_into(x, x, np.empty_like(x))


def _silu_in_place(x: np.ndarray, t: np.ndarray) -> None:
    silu_into(x, x, t)


# Fused activations that need an x-sized scratch, and their forms taking it.
_SCRATCH_FORMS: dict[InPlace, Callable[[np.ndarray, np.ndarray], None]] = {
    _hard_swish: _hard_swish_into,
    _silu: _silu_in_place,
}


def with_scratch(act: InPlace | None, out: np.ndarray, *, last: bool = False) -> InPlace | None:
    """`act` for a step that applies it to `out` or to parts of it (see `scratched`);
    None stays None."""
    return None if act is None else scratched(act, out, last=last)


def scratched(act: InPlace, out: np.ndarray, *, last: bool = False) -> InPlace:
    """`act` for a step that applies it to `out` or to parts of it, called while the step
    is bound: an activation that needs scratch (hard-swish, SiLU) takes it once from the
    plan's arena (a workspace temporary, shared with other steps) instead of a new
    out-sized array on every call. With `last` (the activation is the step's last pass,
    after everything else it computes), the scratch may share bytes with the step's
    other temporaries. Other activations, and an `act` given its scratch already, are
    returned as they are."""
    form = _SCRATCH_FORMS.get(act)
    if form is None or out.dtype.kind != "f":
        return act
    late = (
        temporary_after((out.size,), out.dtype) if last else Late(temporary((out.size,), out.dtype))
    )
    views: dict[tuple, np.ndarray] = {}

    def applied(x: np.ndarray) -> None:
        key = (x.shape, x.strides, x.dtype)
        t = views.get(key)
        if t is None:
            t = views[key] = _scratch_like(cast(np.ndarray, late.array), x)
        form(x, t if t.shape == x.shape else np.empty_like(x))

    return applied


def _scratch_like(flat: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A view of `flat`'s first x.size elements with x's shape and memory order (ufuncs
    over both then walk the same order); an empty array when x is larger."""
    if x.size > flat.size or x.dtype != flat.dtype:
        return np.empty(0, flat.dtype)
    order = sorted(range(x.ndim), key=lambda axis: -abs(x.strides[axis]))
    buf = flat[: x.size].reshape([x.shape[axis] for axis in order])
    return buf.transpose(np.argsort(order))


def _scalar(dtype: np.dtype, value: float) -> np.ndarray:
    """A 0-d array of `dtype` holding `value`, made once (see _bounds)."""
    key = (dtype, value)
    array = _SCALARS.get(key)
    if array is None:
        array = _SCALARS[key] = np.array(value, dtype)
    return array


_SCALARS: dict[tuple[np.dtype, float], np.ndarray] = {}
scalar = _scalar


FUSED_ACTIVATIONS: dict[Activation, InPlace | None] = {
    Activation.NONE: None,
    Activation.RELU: _relu,
    Activation.RELU6: _relu6,
    Activation.SIGMOID: _sigmoid,
    Activation.TANH: _tanh,
    Activation.HARD_SWISH: _hard_swish,
    Activation.SILU: _silu,
}
"""Activation name -> in-place function (None: nothing to apply)."""


def fused_activation(
    op: str,
    attrs: dict,
) -> InPlace | None:
    """The in-place activation named by a node's `activation` attribute (plus its params)."""
    name = attrs.get("activation", "none")
    if name == Activation.CLIP:
        lo = float(attrs.get("clip_min", -np.inf))
        hi = float(attrs.get("clip_max", np.inf))
        return lambda x: _clip(x, lo, hi, out=x)
    if name == Activation.LEAKY_RELU:
        alpha = float(attrs.get("alpha", 0.01))
        return lambda x: np.maximum(x, x * alpha, out=x)
    if name not in FUSED_ACTIVATIONS:
        raise ShapeError(
            f"{op}: unknown fused activation {name!r}; expected one of "
            f"{sorted([*FUSED_ACTIVATIONS, Activation.CLIP, Activation.LEAKY_RELU])}"
        )
    return FUSED_ACTIVATIONS[name]
