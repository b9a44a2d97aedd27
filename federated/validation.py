"""Checks every decoded update passes before it may touch an aggregate."""

from __future__ import annotations

import math

import numpy as np

from sporenet.federated.aggregation import Weights
from sporenet.federated.errors import UpdateRejectedError


def update_norm(update: Weights) -> float:
    """L2 norm of an update over all of its tensors."""
    return math.sqrt(sum(float(np.vdot(a, a)) for a in update.values()))


def validate_update(update: Weights, *, num_samples: int, max_norm: float | None = None) -> float:
    """Refuse non-finite values, a non-positive sample count or an update beyond `max_norm`.

    Names, shapes and dtypes are checked while decoding (codec.decode_update). Returns the
    update's L2 norm (logged and exported as a metric).
    """
    if num_samples <= 0:
        raise UpdateRejectedError(f"num_samples must be > 0, got {num_samples}")
    for name, a in update.items():
        if not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise UpdateRejectedError(
                f"tensor {name!r}: {bad} of {a.size} values are NaN or infinite"
            )
    norm = update_norm(update)
    if max_norm is not None and norm > max_norm:
        raise UpdateRejectedError(
            f"update L2 norm {norm:.6g} exceeds the bound max_update_norm={max_norm:g}"
        )
    return norm
