"""The one interface every aggregation strategy implements."""

from __future__ import annotations

from abc import ABC
from typing import Any, ClassVar

import numpy as np

from sporenet.federated.aggregation import Aggregator, Template, WeightedMeanAggregator, Weights


class Strategy(ABC):
    """How a round is configured, aggregated and turned into the next global model.

    A strategy works on deltas (client weights minus global weights): `make_aggregator`
    folds them during the round, `apply` turns the aggregated delta into new weights.
    `state` carries server-side optimizer moments between rounds; it is persisted with
    each model version, so it must hold arrays only.
    """

    name: ClassVar[str]
    #: True for strategies that need every client's update on its own (order statistics,
    #: distances): secure aggregation and differential privacy's clipped noised mean,
    #: which reveal only a sum, cannot run them.
    needs_individual_updates: ClassVar[bool] = False

    def fit_config(self, server_round: int) -> dict[str, Any]:
        """Settings sent to every client with its training task (e.g. FedProx's mu)."""
        return {}

    def make_aggregator(self, template: Template) -> Aggregator:
        """The aggregation stage of one round (a running weighted mean by default)."""
        return WeightedMeanAggregator(template)

    def apply(
        self, weights: Weights, delta: Weights, state: dict[str, np.ndarray]
    ) -> tuple[Weights, dict[str, np.ndarray]]:
        """The next global weights and optimizer state (plain averaging by default)."""
        return {n: (w + delta[n]).astype(w.dtype, copy=False) for n, w in weights.items()}, state


def stack(updates: list[Weights] | tuple[Weights, ...], name: str) -> np.ndarray:
    """One tensor of every update stacked on a new first axis."""
    return np.stack([u[name] for u in updates])
