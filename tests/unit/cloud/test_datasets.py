"""The digits split: first 1347 samples for training, last 450 for testing, in order."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.cloud.datasets import load_digits

sklearn = pytest.importorskip(
    "sklearn", reason="the digits data ships with scikit-learn (the optional `datasets` extra)"
)


def test_digits_split_sizes_order_and_dtypes():
    from sklearn.datasets import load_digits as sk_load

    raw = sk_load()
    d = load_digits()
    assert d.x_train.shape == (1347, 1, 8, 8) and d.x_test.shape == (450, 1, 8, 8)
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.x_train.reshape(1347, 64), raw.data[:1347])
    np.testing.assert_array_equal(d.y_test, raw.target[1347:])
    assert d.x_train.min() == 0 and d.x_train.max() == 16
    assert load_digits(flat=True).x_test.shape == (450, 64)
    assert d.labels == [str(k) for k in range(10)]


def test_random_shift_moves_each_image_by_at_most_one_pixel():
    from sporenet.cloud.datasets import random_shift

    x = np.random.default_rng(0).uniform(1, 16, size=(64, 1, 8, 8)).astype(np.float32)
    shifted = random_shift(x, np.random.default_rng(1))
    assert shifted.shape == x.shape and shifted.dtype == x.dtype
    moves = set()
    for k in range(len(x)):
        padded = np.pad(x[k, 0], 1)
        match = [
            (dy, dx)
            for dy in range(3)
            for dx in range(3)
            if np.array_equal(padded[dy : dy + 8, dx : dx + 8], shifted[k, 0])
        ]
        assert match, f"image {k} is not a one-pixel shift of the original"
        moves.add(match[0])
    assert len(moves) > 3  # the shifts really vary across the batch
