"""Optimizers: configuration plus the state (moment slots, step count) that outlives a fit.

The update math is not here: both modes run lite's optimizer update ops (the training
graph's in graph mode, the same kernels through `run_op` in eager mode). These objects
describe the optimizer, turn into lite's `OptimizerConfig`, and hold the slots between
`fit` calls and in checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet.cloud._checks import number
from sporenet.cloud.errors import ConfigError


@dataclass
class OptimizerState:
    """Slots by name ("<param>/<slot>") and the number of updates done so far."""

    slots: dict[str, np.ndarray] = field(default_factory=dict)
    step: int = 0


class Optimizer:
    """Base class; subclasses set `kind` and their hyper-parameters."""

    kind: str = ""

    def __init__(self, lr: float) -> None:
        self.lr = number("lr", lr, low=0.0, low_open=True)
        self.state = OptimizerState()

    def hyperparameters(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_config(self) -> Any:
        """lite's OptimizerConfig for this optimizer."""
        from sporenet.lite.training import OptimizerConfig

        return OptimizerConfig(kind=self.kind, lr=self.lr, **self.hyperparameters())

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "lr": self.lr, **self.hyperparameters()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.describe().items() if k != "kind")
        return f"{type(self).__name__}({args})"


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and weight decay."""

    kind = "sgd"

    def __init__(
        self,
        lr: float = 0.01,
        *,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(lr)
        self.momentum = number("momentum", momentum, low=0.0, high=1.0, high_open=True)
        self.weight_decay = number("weight_decay", weight_decay, low=0.0)
        if nesterov and self.momentum == 0.0:
            raise ConfigError("`nesterov` needs `momentum` > 0")
        self.nesterov = bool(nesterov)

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "weight_decay": self.weight_decay,
        }


class Adam(Optimizer):
    """Adam; `weight_decay` is L2 added to the gradient (use AdamW for decoupled decay)."""

    kind = "adam"

    def __init__(
        self,
        lr: float = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(lr)
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise ConfigError(f"`betas` must be a pair of numbers in [0, 1), got {betas!r}")
        self.betas = (
            number("betas[0]", betas[0], low=0.0, high=1.0, high_open=True),
            number("betas[1]", betas[1], low=0.0, high=1.0, high_open=True),
        )
        self.eps = number("eps", eps, low=0.0, low_open=True)
        self.weight_decay = number("weight_decay", weight_decay, low=0.0)

    def hyperparameters(self) -> dict[str, Any]:
        return {"betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay}


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter)."""

    kind = "adamw"

    def __init__(
        self,
        lr: float = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(lr, betas=betas, eps=eps, weight_decay=weight_decay)


OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def get_optimizer(value: Any) -> Optimizer:
    """An Optimizer from an instance or a name ("sgd", "adam", "adamw": default settings)."""
    if isinstance(value, Optimizer):
        return value
    if isinstance(value, str) and value in OPTIMIZERS:
        return OPTIMIZERS[value]()
    raise ConfigError(
        f"`optimizer` must be an Optimizer or one of {sorted(OPTIMIZERS)}, got {value!r}"
    )
