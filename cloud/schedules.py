"""Learning-rate schedules for `LearningRateScheduler`: lr as a function of the epoch (or
step) count t = 0, 1, 2, ...

The math lives in lite (`sporenet.lite.training.schedules`, shared with on-device
training); these subclasses check their arguments when built and raise ConfigError naming
the parameter. Any callable `f(t) -> lr` works as a schedule too.
"""

from __future__ import annotations

from sporenet.cloud._checks import number, positive_int
from sporenet.cloud.errors import ConfigError
from sporenet.lite.training import schedules as _lite


class StepLR(_lite.StepLR):
    """lr * gamma ** (t // step_size)."""

    def __post_init__(self) -> None:
        number("lr", self.lr, low=0.0, low_open=True)
        positive_int("step_size", self.step_size)
        number("gamma", self.gamma, low=0.0, low_open=True)


class CosineLR(_lite.CosineLR):
    """Half a cosine from lr at t=0 to min_lr at t=total_steps (and min_lr after)."""

    def __post_init__(self) -> None:
        lr = number("lr", self.lr, low=0.0, low_open=True)
        positive_int("total_steps", self.total_steps)
        number("min_lr", self.min_lr, low=0.0, high=lr)


class WarmUp(_lite.WarmUp):
    """Linear warm-up to `after(warmup_steps)` over the first `warmup_steps`, then `after`."""

    def __post_init__(self) -> None:
        if not callable(self.after):
            raise ConfigError(f"`after` must be a schedule (callable), got {self.after!r}")
        positive_int("warmup_steps", self.warmup_steps)


__all__ = ["CosineLR", "StepLR", "WarmUp"]
