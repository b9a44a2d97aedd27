"""Fused activations: the in-place functions Conv2D and FullyConnected apply to their output.

The same names are used by the `activation` attribute in model files and by the converter's
activation-fusion pass.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.lite.errors import ShapeError

InPlace = Callable[[np.ndarray], None]


def _relu(x: np.ndarray) -> None:
    # clip, not maximum(x, 0): NumPy 2.x runs maximum against a scalar in a scalar loop,
    # 3-4x slower than clip's vectorised one (NaN still propagates; -0.0 stays -0.0).
    np.clip(x, 0, np.inf, out=x)


def _relu6(x: np.ndarray) -> None:
    np.clip(x, 0, 6, out=x)


def _sigmoid(x: np.ndarray) -> None:
    np.negative(x, out=x)
    np.exp(x, out=x)
    x += 1
    np.reciprocal(x, out=x)


def _tanh(x: np.ndarray) -> None:
    np.tanh(x, out=x)


def _hard_swish(x: np.ndarray) -> None:
    x *= np.clip(x + 3, 0, 6) * (1 / 6)


FUSED_ACTIVATIONS: dict[str, InPlace | None] = {
    "none": None,
    "relu": _relu,
    "relu6": _relu6,
    "sigmoid": _sigmoid,
    "tanh": _tanh,
    "hard_swish": _hard_swish,
}
"""Activation name -> in-place function (None: nothing to apply)."""


def fused_activation(op: str, attrs: dict, ) -> InPlace | None:
    """The in-place activation named by a node's `activation` attribute (plus its params)."""
    name = attrs.get("activation", "none")
    if name == "clip":
        lo = float(attrs.get("clip_min", -np.inf))
        hi = float(attrs.get("clip_max", np.inf))
        return lambda x: np.clip(x, lo, hi, out=x)
    if name == "leaky_relu":
        alpha = float(attrs.get("alpha", 0.01))
        return lambda x: np.maximum(x, x * alpha, out=x)
    if name not in FUSED_ACTIVATIONS:
        raise ShapeError(
            f"{op}: unknown fused activation {name!r}; expected one of "
            f"{sorted([*FUSED_ACTIVATIONS, 'clip', 'leaky_relu'])}"
        )
    return FUSED_ACTIVATIONS[name]
