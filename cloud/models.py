"""Small reference models for the 8x8 digits data (examples, benchmarks, demos).

Both take raw pixels (N, 1, 8, 8) with values 0..16 and rescale them inside the model, so
the exported file needs no preprocessing outside it.
"""

from __future__ import annotations

from sporenet.cloud import layers as L
from sporenet.cloud.module import Module, Sequential


def digits_mlp(*, hidden: int = 128) -> Sequential:
    """Rescale, Flatten, Dense(64, hidden), ReLU, Dense(hidden, 64), ReLU, Dense(64, 10)."""
    return Sequential(
        L.Rescale(1 / 16),
        L.Flatten(),
        ("fc1", L.Dense(64, hidden)),
        L.ReLU(),
        ("fc2", L.Dense(hidden, 64)),
        L.ReLU(),
        ("head", L.Dense(64, 10)),
    )


def digits_cnn(*, width: int = 32, batch_norm: bool = True, dropout: float = 0.3) -> Sequential:
    """Three 3x3 conv blocks (conv1..3, [bn1..3], ReLU) at 8x8, 8x8 and 4x4 with 2x2
    max-pools after the second and third, then dropout and one Dense layer on the
    2 * width * 2 * 2 features (the "head")."""

    def block(k: int, cin: int, cout: int) -> list[Module | tuple[str, Module]]:
        norm = [(f"bn{k}", L.BatchNorm2d(cout))] if batch_norm else []
        return [
            (f"conv{k}", L.Conv2d(cin, cout, 3, padding=1, bias=not batch_norm)),
            *norm,
            L.ReLU(),
        ]

    head_dropout: list[Module] = [L.Dropout(dropout)] if dropout else []
    return Sequential(
        L.Rescale(1 / 16),
        *block(1, 1, width),
        *block(2, width, width),
        L.MaxPool2d(2),
        *block(3, width, 2 * width),
        L.MaxPool2d(2),
        L.Flatten(),
        *head_dropout,
        ("head", L.Dense(2 * width * 4, 10)),
    )


def fashion_cnn(*, width: int = 16) -> Sequential:
    """For Fashion-MNIST's raw 28x28 pixels (0..255): Rescale, two 3x3 conv blocks (conv1,
    conv2; ReLU, 2x2 max-pool) at 28x28 and 14x14, then one Dense layer (the "head") on
    the 2 * width * 7 * 7 features. No BatchNorm or Dropout, so it trains data-parallel."""
    return Sequential(
        L.Rescale(1 / 255),
        ("conv1", L.Conv2d(1, width, 3, padding=1)),
        L.ReLU(),
        L.MaxPool2d(2),
        ("conv2", L.Conv2d(width, 2 * width, 3, padding=1)),
        L.ReLU(),
        L.MaxPool2d(2),
        L.Flatten(),
        ("head", L.Dense(2 * width * 7 * 7, 10)),
    )
