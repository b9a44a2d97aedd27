"""The score transforms of ai.onnx.ml classifiers and regressors (post_transform), in
float32 as onnxruntime computes them."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import numpy as np


class PostTransform(StrEnum):
    """ONNX's post_transform attribute values."""

    NONE = "NONE"
    LOGISTIC = "LOGISTIC"
    SOFTMAX = "SOFTMAX"
    SOFTMAX_ZERO = "SOFTMAX_ZERO"
    PROBIT = "PROBIT"


def parse(value: str, fail: Callable[[str], Exception]) -> PostTransform:
    """The transform named `value`, or `fail(message)` raised."""
    try:
        return PostTransform(value)
    except ValueError:
        raise fail(
            f"post_transform must be one of {[t.value for t in PostTransform]}, got {value!r}"
        ) from None


def logistic(v: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-v)), through |v| so no exp overflows."""
    e = (1.0 / (1.0 + np.exp(-np.abs(v)))).astype(np.float32)
    return np.where(v < 0, np.float32(1) - e, e)


def softmax(v: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_zero(v: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in which (near) zero scores stay zero."""
    top = v.max(axis=-1, keepdims=True)
    nonzero = np.abs(v) > np.float32(1e-7)
    e = np.where(nonzero, np.exp(v - top), v * np.exp(-top))
    total = np.where(nonzero, e, 0).sum(axis=-1, keepdims=True)
    return e / total


def probit(v: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2v - 1), erfinv by the closed-form approximation onnxruntime uses
    (Winitzki's, a = 0.147), so results agree to float32 rounding."""
    x = (2 * v - 1).astype(np.float32)
    sign = np.where(x < 0, np.float32(-1), np.float32(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log((1 - x) * (1 + x))
        a = np.float32(2 / (3.14159 * 0.147)) + np.float32(0.5) * log
        b = np.float32(1 / 0.147) * log
        root = np.sqrt(-a + np.sqrt(a * a - b))
    return (np.float32(1.41421356) * sign * root).astype(np.float32)


def apply(transform: PostTransform, scores: np.ndarray) -> np.ndarray:
    """`scores` [N, K] (K >= 2) transformed, float32."""
    scores = scores.astype(np.float32, copy=False)
    if transform is PostTransform.LOGISTIC:
        return logistic(scores)
    if transform is PostTransform.SOFTMAX:
        return softmax(scores)
    if transform is PostTransform.SOFTMAX_ZERO:
        return softmax_zero(scores)
    if transform is PostTransform.PROBIT:
        return probit(scores)
    return scores


def second_class(transform: PostTransform, score: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """Two columns from one binary score [N], as onnxruntime writes them: `mode` per row is
    0 or 1 (weights all positive: [1 - s, s]), 2 (mixed weights, positive class won) or 3
    (mixed weights, negative class won); PROBIT maps the score alone."""
    s = score.astype(np.float32)
    out = np.empty((s.size, 2), np.float32)
    if transform is PostTransform.PROBIT:
        out[:, 0] = probit(s)
        out[:, 1] = 0
        return out
    # Written column by column into one array: a binary model is often called on a few
    # rows, where each stacked temporary costs more than its arithmetic.
    if transform is PostTransform.LOGISTIC:
        negative, positive = logistic(-s), logistic(s)
    else:
        negative = np.where(mode == 2, -s, s)
        positive = -negative
    all_positive = mode <= 1
    np.copyto(out[:, 0], np.where(all_positive, 1 - s, negative))
    np.copyto(out[:, 1], np.where(all_positive, s, positive))
    return out
