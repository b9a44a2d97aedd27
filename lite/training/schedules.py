"""Learning-rate schedules: plain functions of the step (or epoch) number.

The train graph takes the learning rate as an input, so a schedule is applied by passing
`schedule(step)` to Trainer.step; nothing is re-planned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Schedule = Callable[[int], float]


@dataclass(frozen=True)
class StepLR:
    """lr * gamma ** (step // step_size), as torch.optim.lr_scheduler.StepLR."""

    lr: float
    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        if self.step_size < 1:
            raise ValueError(f"step_size must be >= 1, got {self.step_size}")

    def __call__(self, step: int) -> float:
        return self.lr * self.gamma ** (step // self.step_size)


@dataclass(frozen=True)
class CosineLR:
    """Cosine decay from lr to min_lr over total_steps, then min_lr (CosineAnnealingLR)."""

    lr: float
    total_steps: int
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")

    def __call__(self, step: int) -> float:
        t = min(step, self.total_steps) / self.total_steps
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * t))


@dataclass(frozen=True)
class WarmUp:
    """Linear warm-up from lr/warmup_steps to `after(warmup_steps)`, then `after(step)`."""

    after: Schedule
    warmup_steps: int

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.after(self.warmup_steps) * (step + 1) / self.warmup_steps
        return self.after(step)
