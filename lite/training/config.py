"""Optimizer configuration, validated when it is built."""

from __future__ import annotations

from dataclasses import dataclass

OPTIMIZERS = ("sgd", "adam", "adamw")
LOSSES = ("softmax_cross_entropy", "mse", "bce_with_logits")


@dataclass(frozen=True)
class OptimizerConfig:
    """Which update op a train graph ends with, and its hyper-parameters.

    kind: "sgd" (momentum, nesterov, weight_decay as in torch.optim.SGD), "adam" (L2 weight
    decay added to the gradient) or "adamw" (decoupled weight decay). `lr` is the default
    learning rate; the train graph takes the rate as an input, so it may change every step.
    """

    kind: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise ValueError(f"optimizer kind must be one of {list(OPTIMIZERS)}, got {self.kind!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.momentum < 0 or self.weight_decay < 0:
            raise ValueError(
                f"momentum ({self.momentum}) and weight_decay ({self.weight_decay}) must be >= 0"
            )
        if self.nesterov and (self.kind != "sgd" or self.momentum == 0):
            raise ValueError("nesterov needs kind='sgd' and a momentum > 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two values in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
