"""Small argument checks shared by layers, optimizers and callbacks (raise ConfigError)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sporenet.cloud.errors import ConfigError


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"`{name}` must be a positive int, got {value!r}")
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"`{name}` must be a non-negative int, got {value!r}")
    return int(value)


def number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A real number within [low, high] (open ends where asked)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"`{name}` must be a number, got {value!r}")
    v = float(value)
    if v != v:
        raise ConfigError(f"`{name}` must not be NaN")
    if low is not None and (v < low or (low_open and v == low)):
        raise ConfigError(f"`{name}` must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (v > high or (high_open and v == high)):
        raise ConfigError(f"`{name}` must be {'<' if high_open else '<='} {high}, got {value!r}")
    return v


def pair(name: str, value: Any, *, minimum: int = 1) -> tuple[int, int]:
    """An int or a pair of ints (kernel size, stride, dilation), each >= minimum."""
    items: Sequence[Any] = (value, value) if isinstance(value, int) else value
    if (
        not isinstance(items, tuple | list)
        or len(items) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in items)
    ):
        raise ConfigError(f"`{name}` must be an int >= {minimum} or a pair of them, got {value!r}")
    return int(items[0]), int(items[1])


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    if value not in options:
        raise ConfigError(f"`{name}` must be one of {list(options)}, got {value!r}")
    return str(value)
