"""FedProx (Li et al., 2020): FedAvg whose clients add (mu/2)·||w - w_global||² to their loss."""

from __future__ import annotations

from typing import Any

from sporenet.federated.errors import ConfigError
from sporenet.federated.strategies.fedavg import FedAvg


class FedProx(FedAvg):
    """Aggregates like FedAvg; sends `proximal_mu` so client training can add the prox term."""

    name = "fedprox"

    def __init__(self, *, proximal_mu: float = 0.01) -> None:
        if not proximal_mu >= 0:
            raise ConfigError(f"`proximal_mu` must be >= 0, got {proximal_mu}")
        self.proximal_mu = float(proximal_mu)

    def fit_config(self, server_round: int) -> dict[str, Any]:
        return {"proximal_mu": self.proximal_mu}
