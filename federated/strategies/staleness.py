"""Staleness weights for buffered asynchronous jobs (FedBuff, Nguyen et al. 2022).

A device trains on the version it downloaded; when its update arrives `tau` versions
have been published since. The server scales the update by `weight(tau)` (at most 1)
before folding it into the buffer, so stale updates move the model less. Pure
functions, found through the explicit table `STALENESS` like the strategies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sporenet.federated.errors import ConfigError


class Staleness(Protocol):
    """A staleness weight: `weight(tau)` in (0, 1] for an update `tau` versions old."""

    name: str

    def weight(self, tau: int) -> float: ...


@dataclass(frozen=True)
class Constant:
    """Every update counts fully, however stale (FedBuff's "constant")."""

    name: str = "constant"

    def weight(self, tau: int) -> float:
        return 1.0


@dataclass(frozen=True)
class Polynomial:
    """`(1 + tau) ** -exponent` (FedBuff's default uses exponent 0.5)."""

    exponent: float = 0.5
    name: str = "polynomial"

    def __post_init__(self) -> None:
        if not self.exponent >= 0:
            raise ConfigError(f"`job.staleness.exponent` must be >= 0, got {self.exponent!r}")

    def weight(self, tau: int) -> float:
        return float((1.0 + tau) ** -self.exponent)


@dataclass(frozen=True)
class Hinge:
    """1 up to `cutoff` versions old, then `1 / (slope * (tau - cutoff) + 1)`."""

    slope: float = 10.0
    cutoff: int = 4
    name: str = "hinge"

    def __post_init__(self) -> None:
        if not self.slope >= 0:
            raise ConfigError(f"`job.staleness.slope` must be >= 0, got {self.slope!r}")
        if self.cutoff < 0:
            raise ConfigError(f"`job.staleness.cutoff` must be >= 0, got {self.cutoff!r}")

    def weight(self, tau: int) -> float:
        if tau <= self.cutoff:
            return 1.0
        return 1.0 / (self.slope * (tau - self.cutoff) + 1.0)


#: name -> (class, its options and their accepted types).
STALENESS: dict[str, tuple[type, dict[str, tuple[type, ...]]]] = {
    "constant": (Constant, {}),
    "polynomial": (Polynomial, {"exponent": (int, float)}),
    "hinge": (Hinge, {"slope": (int, float), "cutoff": (int,)}),
}


def make_staleness(name: str, options: dict[str, Any]) -> Staleness:
    """The staleness weight `name` with `options` (ConfigError naming a bad one)."""
    if name not in STALENESS:
        raise ConfigError(f"unknown `job.staleness.name` {name!r}; known: {sorted(STALENESS)}")
    cls, known = STALENESS[name]
    for key, value in options.items():
        if key not in known:
            raise ConfigError(
                f"unknown key `job.staleness.{key}` for {name!r}; known keys: {sorted(known)}"
            )
        types = known[key]
        if not isinstance(value, types) or isinstance(value, bool):
            names = " or ".join(t.__name__ for t in types)
            raise ConfigError(f"`job.staleness.{key}` must be {names}, got {value!r}")
    made: Staleness = cls(**options)
    return made
