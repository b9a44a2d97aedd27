"""Coordinate-wise trimmed mean (Yin et al., 2018): robust to a fraction of bad clients."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.federated.aggregation import Aggregator, BufferedAggregator, Template, Weights
from sporenet.federated.errors import AggregationError, ConfigError
from sporenet.federated.strategies.base import Strategy, stack


def trimmed_mean(updates: Sequence[Weights], beta: float) -> Weights:
    """Per coordinate, drop the floor(beta·n) largest and smallest values and average the rest."""
    n = len(updates)
    k = int(beta * n)
    if n - 2 * k < 1:
        raise AggregationError(
            f"trimming {k} from each end of {n} updates leaves nothing (beta={beta})"
        )
    out: Weights = {}
    for name in updates[0]:
        s = np.sort(stack(list(updates), name), axis=0)
        out[name] = s[k : n - k].mean(axis=0, dtype=np.float64).astype(s.dtype)
    return out


class TrimmedMean(Strategy):
    """Unweighted coordinate-wise trimmed mean of the deltas; keeps all updates in memory."""

    name = "trimmed_mean"
    needs_individual_updates = True

    def __init__(self, *, beta: float = 0.1) -> None:
        if not 0 <= beta < 0.5:
            raise ConfigError(f"`beta` must be in [0, 0.5), got {beta}")
        self.beta = float(beta)

    def make_aggregator(self, template: Template) -> Aggregator:
        return BufferedAggregator(template, lambda updates, _w: trimmed_mean(updates, self.beta))
