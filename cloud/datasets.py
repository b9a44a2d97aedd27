"""The 8x8 digits dataset of scikit-learn (the `datasets` extra) with the project's split.

The split used everywhere in sporenet: the first 75% of samples (1347) for training, the
last 25% (450) for testing, in the file's order (no shuffling before the split), so every
component and document reports accuracy on the same 450 images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sporenet.cloud.errors import ConfigError

DIGITS_TRAIN_SIZE = 1347
DIGITS_TEST_SIZE = 450
DIGITS_LABELS = [str(d) for d in range(10)]


@dataclass(frozen=True)
class Split:
    """Train and test arrays of one dataset."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    labels: list[str]


def load_digits(*, flat: bool = False) -> Split:
    """Raw pixels as float32 (0..16), images (N, 1, 8, 8) or with `flat` (N, 64);
    labels int64."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as exc:  # scikit-learn is the optional `datasets` extra
        raise ConfigError(
            "the digits dataset needs scikit-learn: pip install 'sporenet[datasets]'"
        ) from exc
    bunch = sk_load_digits()
    x = bunch.data.astype(np.float32)
    y = bunch.target.astype(np.int64)
    x = x if flat else x.reshape(-1, 1, 8, 8)
    n = DIGITS_TRAIN_SIZE
    return Split(
        x_train=np.ascontiguousarray(x[:n]),
        y_train=y[:n].copy(),
        x_test=np.ascontiguousarray(x[n:]),
        y_test=y[n:].copy(),
        labels=list(DIGITS_LABELS),
    )


def random_shift(x: np.ndarray, rng: np.random.Generator, *, max_shift: int = 1) -> np.ndarray:
    """Augmentation for image batches (N, C, H, W): each image moved by up to `max_shift`
    pixels in each direction, the uncovered border filled with zeros. Pass it to fit as
    `augment=random_shift`."""
    if max_shift < 0:
        raise ConfigError(f"`max_shift` must be >= 0, got {max_shift}")
    n, _, h, w = x.shape
    s = max_shift
    padded = np.pad(x, ((0, 0), (0, 0), (s, s), (s, s)))
    dy = rng.integers(0, 2 * s + 1, size=n)
    dx = rng.integers(0, 2 * s + 1, size=n)
    rows = dy[:, None] + np.arange(h)[None, :]  # (N, H)
    cols = dx[:, None] + np.arange(w)[None, :]  # (N, W)
    batch = np.arange(n)[:, None, None, None]
    channel = np.arange(x.shape[1])[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]
