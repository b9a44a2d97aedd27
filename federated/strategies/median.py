"""Coordinate-wise median (Yin et al., 2018)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.federated.aggregation import Aggregator, BufferedAggregator, Template, Weights
from sporenet.federated.strategies.base import Strategy, stack


def coordinate_median(updates: Sequence[Weights]) -> Weights:
    """The per-coordinate median of the updates (mean of the middle two for even counts)."""
    return {
        name: np.median(stack(list(updates), name), axis=0).astype(a.dtype)
        for name, a in updates[0].items()
    }


class Median(Strategy):
    """Unweighted coordinate-wise median of the deltas; keeps all updates in memory."""

    name = "median"
    needs_individual_updates = True

    def make_aggregator(self, template: Template) -> Aggregator:
        return BufferedAggregator(template, lambda updates, _w: coordinate_median(updates))
