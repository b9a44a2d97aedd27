"""FedAvgM (Hsu et al., 2019): FedAvg with momentum on the server.

With Δ the sample-weighted mean client delta and v the server's velocity:
    v = momentum·v + Δ
    w = w + eta·v
momentum 0 and eta 1 is FedAvg. The velocity starts at zero and is kept, like a server
optimizer's moments, with each model version.
"""

from __future__ import annotations

import numpy as np

from sporenet.federated.aggregation import Weights
from sporenet.federated.errors import ConfigError
from sporenet.federated.strategies.fedavg import FedAvg


class FedAvgM(FedAvg):
    """Aggregates like FedAvg; the server steps along the momentum of the mean deltas."""

    name = "fedavgm"

    def __init__(self, *, eta: float = 1.0, momentum: float = 0.9) -> None:
        if not eta > 0:
            raise ConfigError(f"`eta` must be > 0, got {eta}")
        if not 0 <= momentum < 1:
            raise ConfigError(f"`momentum` must be in [0, 1), got {momentum}")
        self.eta, self.momentum = float(eta), float(momentum)

    def apply(
        self, weights: Weights, delta: Weights, state: dict[str, np.ndarray]
    ) -> tuple[Weights, dict[str, np.ndarray]]:
        out: Weights = {}
        new_state: dict[str, np.ndarray] = {}
        for name, w in weights.items():
            d = delta[name].astype(np.float64)
            v = self.momentum * state.get(f"v/{name}", np.zeros_like(d)) + d
            out[name] = (w.astype(np.float64) + self.eta * v).astype(w.dtype)
            new_state[f"v/{name}"] = v
        return out, new_state
