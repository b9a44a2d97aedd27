"""Checks every decoded update passes before it may touch an aggregate."""

from __future__ import annotations

import json
import math
import re

import numpy as np

from sporenet.federated.aggregation import Weights
from sporenet.federated.errors import UpdateRejectedError

_NORM_BLOCK = 1 << 14


def _square_sum(a: np.ndarray) -> float:
    """sum(a**2) in blocks of 16K values (single-precision accumulation errors stay below
    ~1e-8); NaN or infinite when `a` holds such a value, or overflows. Call it with
    overflow and invalid-value warnings off."""
    flat = a.reshape(-1)
    dot = np.dot if flat.dtype.kind == "f" else np.vdot
    if flat.size <= _NORM_BLOCK:  # most tensors: one product, no loop
        return float(dot(flat, flat).real)
    sq = 0.0
    for start in range(0, flat.size, _NORM_BLOCK):
        block = flat[start : start + _NORM_BLOCK]
        sq += float(dot(block, block).real)
    return sq


def _checked_square_sum(name: str, a: np.ndarray, sq: float) -> float:
    """`sq` (the `_square_sum` of `a`), refusing NaN and infinite values.

    A NaN or an infinity makes the sum of squares NaN or infinite, so a finite sum proves
    every value finite. A non-finite sum may also be an overflow of finite values: then
    the values are checked one by one and the sum is recomputed in float64.
    """
    if math.isfinite(sq):
        return sq
    flat = a.reshape(-1)
    finite = np.isfinite(flat)
    if not finite.all():
        bad = int(flat.size - np.count_nonzero(finite))
        raise UpdateRejectedError(
            f"tensor {name!r}: {bad} of {flat.size} values are NaN or infinite"
        )
    wide = flat.astype(np.float64)
    return float(np.dot(wide, wide))


def _gathered_square_sum(update: Weights) -> float | None:
    """sum(a**2) over every tensor of a small update of one float dtype, gathered into one
    array (one product instead of one per tensor); None when it is not finite (then the
    tensors are checked one by one) or the update is not of that kind."""
    arrays = [a.reshape(-1) for a in update.values()]
    if not arrays or sum(a.size for a in arrays) > _NORM_BLOCK:
        return None
    kind = arrays[0].dtype
    if kind.kind != "f" or any(a.dtype != kind for a in arrays):
        return None
    flat = np.concatenate(arrays)
    with np.errstate(over="ignore", invalid="ignore"):
        sq = float(np.dot(flat, flat))
    return sq if math.isfinite(sq) else None


def validate_update(update: Weights, *, num_samples: int, max_norm: float | None = None) -> float:
    """Refuse non-finite values, a non-positive sample count or an update beyond `max_norm`.

    Names, shapes and dtypes are checked while decoding (codec.decode_update). Returns the
    update's L2 norm (logged and exported as a metric). One pass over each tensor in the
    common case (all values finite).
    """
    if num_samples <= 0:
        raise UpdateRejectedError(f"num_samples must be > 0, got {num_samples}")
    total = _gathered_square_sum(update)
    if total is None:  # per tensor: a non-finite value is named, an overflow recomputed
        with np.errstate(over="ignore", invalid="ignore"):  # once per update, not per tensor
            sums = [_square_sum(a) for a in update.values()]
        total = 0.0
        for (name, a), sq in zip(update.items(), sums, strict=True):
            total += _checked_square_sum(name, a, sq)
    norm = math.sqrt(total)
    if max_norm is not None and norm > max_norm:
        raise UpdateRejectedError(
            f"update L2 norm {norm:.6g} exceeds the bound max_update_norm={max_norm:g}"
        )
    return norm


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def parse_metrics(text: str, what: str) -> dict[str, float]:
    """A client's metrics: a JSON object of finite numbers ('' is none)."""
    if not text:
        return {}
    # A flat object has one '{' and no '[' outside its strings: refuse nesting before the
    # parser recurses into it (deep recursion on the event loop breaks unrelated calls).
    bare = _JSON_STRING.sub('""', text)
    if bare.count("{") + bare.count("[") > 1:
        raise UpdateRejectedError(
            f"{what} must be a flat JSON object of numbers, got nesting in {text[:200]!r}"
        )
    try:
        # ValueError: bad JSON, or an integer of more digits than Python converts;
        # RecursionError: nesting deeper than the parser's stack.
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise UpdateRejectedError(
            f"{what} must be a JSON object of numbers: {str(e)[:200]}"
        ) from None
    try:
        ok = isinstance(value, dict) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in value.values()
        )
        metrics = {str(k): float(v) for k, v in value.items()} if ok else {}
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        raise UpdateRejectedError(
            f"{what} must be a JSON object of finite numbers, got {text[:200]!r}"
        )
    return metrics
