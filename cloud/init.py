"""Parameter initialization and the seed it draws from."""

from __future__ import annotations

import numpy as np

_state = {"rng": np.random.default_rng(0)}


def manual_seed(seed: int) -> None:
    """Seed the generator that layer constructors draw their initial weights from."""
    _state["rng"] = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    return _state["rng"]


def he_uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Kaiming/He uniform: U(-b, b) with b = sqrt(6 / fan_in), suited to ReLU networks."""
    bound = np.sqrt(6.0 / max(fan_in, 1))
    return generator().uniform(-bound, bound, size=shape).astype(np.float32)


def bias_uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as PyTorch initializes biases."""
    bound = 1.0 / np.sqrt(max(fan_in, 1))
    return generator().uniform(-bound, bound, size=shape).astype(np.float32)
