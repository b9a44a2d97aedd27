"""Adaptive server optimizers (Reddi et al., 2021, "Adaptive Federated Optimization").

The mean client delta is a pseudo-gradient Δ; with m, v the server moments:
    m = beta1·m + (1-beta1)·Δ
    v = v + Δ²                               (Adagrad)
    v = beta2·v + (1-beta2)·Δ²               (Adam)
    v = v - (1-beta2)·Δ²·sign(v - Δ²)        (Yogi)
    w = w + eta · m / (sqrt(v) + tau)
Moments start at zero (as in Flower); FedAdam additionally applies Adam's bias correction.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sporenet.federated.aggregation import Weights
from sporenet.federated.errors import ConfigError
from sporenet.federated.strategies.base import Strategy

_STEP = "meta/step"


def fedopt_step(
    kind: str,
    weights: Weights,
    delta: Weights,
    state: dict[str, np.ndarray],
    *,
    eta: float,
    beta1: float,
    beta2: float,
    tau: float,
) -> tuple[Weights, dict[str, np.ndarray]]:
    """One server-optimizer step of `kind` ("adagrad", "adam" or "yogi"); pure."""
    step = int(state.get(_STEP, np.array(0))) + 1
    new_state: dict[str, np.ndarray] = {_STEP: np.array(step, np.int64)}
    out: Weights = {}
    for name, w in weights.items():
        d = delta[name].astype(np.float64)
        m = beta1 * state.get(f"m/{name}", np.zeros_like(d)) + (1 - beta1) * d
        v_old = state.get(f"v/{name}", np.zeros_like(d))
        d2 = d * d
        if kind == "adagrad":
            v = v_old + d2
        elif kind == "adam":
            v = beta2 * v_old + (1 - beta2) * d2
        elif kind == "yogi":
            v = v_old - (1 - beta2) * d2 * np.sign(v_old - d2)
        else:
            raise ConfigError(f"unknown server optimizer {kind!r}; supported: adagrad, adam, yogi")
        lr = eta
        if kind == "adam":
            lr = eta * np.sqrt(1 - beta2**step) / (1 - beta1**step)
        out[name] = (w.astype(np.float64) + lr * m / (np.sqrt(v) + tau)).astype(w.dtype)
        new_state[f"m/{name}"], new_state[f"v/{name}"] = m, v
    return out, new_state


class FedOpt(Strategy):
    """Base of FedAdagrad, FedAdam and FedYogi: FedAvg aggregation, adaptive server step."""

    kind: ClassVar[str]

    def __init__(
        self, *, eta: float = 0.1, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-9
    ) -> None:
        for key, value, ok in (
            ("eta", eta, eta > 0),
            ("beta1", beta1, 0 <= beta1 < 1),
            ("beta2", beta2, 0 <= beta2 < 1),
            ("tau", tau, tau > 0),
        ):
            if not ok:
                raise ConfigError(f"`{key}` is out of range: {value}")
        self.eta, self.beta1, self.beta2, self.tau = (
            float(eta),
            float(beta1),
            float(beta2),
            float(tau),
        )

    def apply(
        self, weights: Weights, delta: Weights, state: dict[str, np.ndarray]
    ) -> tuple[Weights, dict[str, np.ndarray]]:
        return fedopt_step(
            self.kind,
            weights,
            delta,
            state,
            eta=self.eta,
            beta1=self.beta1,
            beta2=self.beta2,
            tau=self.tau,
        )
