"""FedAvg (McMahan et al., 2017): the sample-weighted mean of client updates."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.federated.aggregation import Weights
from sporenet.federated.errors import AggregationError
from sporenet.federated.strategies.base import Strategy


def weighted_mean(updates: Sequence[Weights], weights: Sequence[float] | np.ndarray) -> Weights:
    """sum_i w_i * u_i / sum_i w_i for every tensor (the batch form of the running mean)."""
    w = np.asarray(weights, np.float64)
    if len(updates) == 0 or w.shape != (len(updates),) or not (w > 0).all():
        raise AggregationError(
            f"need one positive weight per update, got {len(updates)} updates, weights {w}"
        )
    total = float(w.sum())
    return {
        name: (
            sum(wi * u[name].astype(np.float64) for wi, u in zip(w, updates, strict=True)) / total
        ).astype(first.dtype)
        for name, first in updates[0].items()
    }


class FedAvg(Strategy):
    """Next weights = global + sample-weighted mean of the client deltas."""

    name = "fedavg"
