"""Krum and multi-Krum (Blanchard et al., 2017): keep the updates closest to their peers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.federated.aggregation import Aggregator, BufferedAggregator, Template, Weights
from sporenet.federated.errors import AggregationError, ConfigError
from sporenet.federated.strategies.base import Strategy
from sporenet.federated.strategies.fedavg import weighted_mean


def krum_scores(updates: Sequence[Weights], num_malicious: int) -> np.ndarray:
    """Score of each update: summed squared distance to its n - f - 2 nearest others."""
    n = len(updates)
    closest = n - num_malicious - 2
    if closest < 1:
        raise AggregationError(f"Krum needs n > f + 2 updates; got n={n}, f={num_malicious}")
    flat = np.stack(
        [np.concatenate([a.ravel() for a in u.values()]).astype(np.float64) for u in updates]
    )
    sq = (flat * flat).sum(axis=1)
    dist = np.maximum(sq[:, None] + sq[None, :] - 2.0 * flat @ flat.T, 0.0)
    np.fill_diagonal(dist, np.inf)
    return np.sort(dist, axis=1)[:, :closest].sum(axis=1)


def krum(
    updates: Sequence[Weights],
    weights: Sequence[float] | np.ndarray,
    *,
    num_malicious: int,
    num_selected: int = 1,
) -> Weights:
    """Krum (num_selected=1) or multi-Krum: sample-weighted mean of the best-scored updates."""
    scores = krum_scores(updates, num_malicious)
    best = np.argsort(scores, kind="stable")[:num_selected]
    w = np.asarray(weights, np.float64)
    return weighted_mean([updates[i] for i in best], w[best])


class Krum(Strategy):
    """Krum / multi-Krum over the deltas; keeps all updates in memory."""

    name = "krum"
    needs_individual_updates = True

    def __init__(self, *, num_malicious: int = 0, num_selected: int = 1) -> None:
        if num_malicious < 0:
            raise ConfigError(f"`num_malicious` must be >= 0, got {num_malicious}")
        if num_selected < 1:
            raise ConfigError(f"`num_selected` must be >= 1, got {num_selected}")
        self.num_malicious, self.num_selected = int(num_malicious), int(num_selected)

    def make_aggregator(self, template: Template) -> Aggregator:
        return BufferedAggregator(
            template,
            lambda updates, w: krum(
                updates, w, num_malicious=self.num_malicious, num_selected=self.num_selected
            ),
        )
