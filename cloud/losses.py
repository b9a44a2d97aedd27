"""Losses: the names fit accepts (lite's training graph builds the loss ops) and NumPy
versions used for metrics."""

from __future__ import annotations

import numpy as np

from sporenet.cloud._checks import choice

LOSSES = ("softmax_cross_entropy", "mse", "bce_with_logits")
ALIASES = {
    "cross_entropy": "softmax_cross_entropy",
    "sparse_categorical_crossentropy": "softmax_cross_entropy",
    "mean_squared_error": "mse",
}


def loss_name(value: str) -> str:
    """The canonical loss name for `value` (ConfigError naming `loss` if unknown)."""
    return choice("loss", ALIASES.get(value, value), LOSSES)


def softmax_cross_entropy(
    logits: np.ndarray, labels: np.ndarray, label_smoothing: float = 0.0
) -> float:
    """Mean cross-entropy of softmax(logits) against integer or one-hot labels."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    k = logits.shape[-1]
    target = (
        np.eye(k)[labels.astype(np.int64)]
        if labels.ndim == logits.ndim - 1
        else labels.astype(np.float64)
    )
    if label_smoothing:
        target = target * (1 - label_smoothing) + label_smoothing / k
    return float(-(target * logp).sum(axis=-1).mean())


def mse(pred: np.ndarray, target: np.ndarray) -> float:
    return float(np.mean((pred.astype(np.float64) - target.reshape(pred.shape)) ** 2))


def bce_with_logits(logits: np.ndarray, target: np.ndarray) -> float:
    z = logits.astype(np.float64)
    t = target.reshape(z.shape).astype(np.float64)
    return float(np.mean(np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))))


def compute_loss(
    name: str, outputs: np.ndarray, targets: np.ndarray, label_smoothing: float = 0.0
) -> float:
    if name == "softmax_cross_entropy":
        return softmax_cross_entropy(outputs, targets, label_smoothing)
    if name == "mse":
        return mse(outputs, targets)
    return bce_with_logits(outputs, targets)


def accuracy(outputs: np.ndarray, targets: np.ndarray) -> float:
    """Top-1 accuracy for class scores (integer or one-hot targets); for a single output
    column, thresholded at 0 (logits)."""
    if outputs.ndim >= 2 and outputs.shape[-1] > 1:
        predicted = outputs.argmax(axis=-1)
        truth = targets if targets.ndim == outputs.ndim - 1 else targets.argmax(axis=-1)
        return float(np.mean(predicted == truth))
    return float(np.mean((outputs.reshape(-1) > 0) == (targets.reshape(-1) > 0.5)))
