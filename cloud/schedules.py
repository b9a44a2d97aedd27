"""Learning-rate schedules: lr as a function of the epoch (or step) count t = 0, 1, 2, ...

They are plain callables, so `LearningRateScheduler` also accepts any `f(t) -> lr`.
"""

from __future__ import annotations

import math

from sporenet.cloud._checks import number, positive_int


class Schedule:
    """Base class: `schedule(t)` is the learning rate for epoch/step t (from 0)."""

    def __call__(self, t: int) -> float:
        raise NotImplementedError


class Constant(Schedule):
    def __init__(self, lr: float) -> None:
        self.lr = number("lr", lr, low=0.0, low_open=True)

    def __call__(self, t: int) -> float:
        return self.lr


class StepDecay(Schedule):
    """lr * gamma ** (t // step_size)."""

    def __init__(self, lr: float, *, step_size: int, gamma: float = 0.1) -> None:
        self.lr = number("lr", lr, low=0.0, low_open=True)
        self.step_size = positive_int("step_size", step_size)
        self.gamma = number("gamma", gamma, low=0.0, low_open=True)

    def __call__(self, t: int) -> float:
        return self.lr * self.gamma ** (t // self.step_size)


class CosineDecay(Schedule):
    """Half a cosine from lr at t=0 to min_lr at t=total (and min_lr after)."""

    def __init__(self, lr: float, *, total: int, min_lr: float = 0.0) -> None:
        self.lr = number("lr", lr, low=0.0, low_open=True)
        self.total = positive_int("total", total)
        self.min_lr = number("min_lr", min_lr, low=0.0, high=self.lr)

    def __call__(self, t: int) -> float:
        progress = min(max(t, 0), self.total) / self.total
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))


class WarmUp(Schedule):
    """Linear warm-up over `warmup` epochs/steps from start_factor * after(0) to after(0),
    then `after` shifted by `warmup` (so after(0) is the first post-warm-up value)."""

    def __init__(self, after: Schedule | float, *, warmup: int,
                 start_factor: float = 0.1) -> None:
        self.after = after if callable(after) else Constant(after)
        self.warmup = positive_int("warmup", warmup)
        self.start_factor = number("start_factor", start_factor, low=0.0, high=1.0)

    def __call__(self, t: int) -> float:
        if t < self.warmup:
            frac = self.start_factor + (1 - self.start_factor) * t / self.warmup
            return frac * self.after(0)
        return self.after(t - self.warmup)
