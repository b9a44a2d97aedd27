"""Central DP: the server clips every update and adds Gaussian noise to the sum.

`CentralDPAggregator` implements sporenet.federated.aggregation.Aggregator, so the round
loop uses it like FedAvg's aggregator: each update is clipped to L2 norm C when folded
in (O(model) memory), and `result()` returns (sum + N(0, (zC)^2)) / expected_clients.
Dividing by the *expected* number of sampled clients, not the number that reported,
keeps the sensitivity of the released mean at C / expected_clients (McMahan et al. 2018).
Sample weights are ignored on purpose: weighting by example count would let one client's
influence exceed C. With adaptive clipping the norm moves after every round.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sporenet.federated.aggregation import Template, Weights, restore_sums
from sporenet.federated.errors import AggregationError
from sporenet.federated.privacy.clipping import (
    AdaptiveClipping,
    check_positive,
    clip_l2,
    update_noise_multiplier,
)
from sporenet.federated.privacy.errors import PrivacyConfigError


class CentralDPAggregator:
    """Clip-and-noise aggregation with a fixed or adaptive clipping norm."""

    def __init__(
        self,
        template: Template,
        *,
        noise_multiplier: float,
        expected_clients: int,
        clipping_norm: float | None = None,
        adaptive: AdaptiveClipping | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        if (clipping_norm is None) == (adaptive is None):
            raise PrivacyConfigError("give exactly one of `clipping_norm` (fixed) or `adaptive`")
        self.noise_multiplier = check_positive(
            "noise_multiplier", noise_multiplier, allow_zero=True
        )
        if not isinstance(expected_clients, int) or expected_clients < 1:
            raise PrivacyConfigError(
                f"`expected_clients` must be an int >= 1, found {expected_clients!r}"
            )
        self.expected_clients = expected_clients
        self.adaptive = adaptive
        # Only read when `adaptive` is None, and then the constructor required a fixed norm.
        self._fixed = (
            check_positive("clipping_norm", clipping_norm) if clipping_norm is not None else 0.0
        )
        # The released count takes part of the privacy budget: less noise remains for the sum.
        self._sum_noise = (
            update_noise_multiplier(noise_multiplier, adaptive.count_noise_multiplier)
            if adaptive is not None and noise_multiplier > 0
            else noise_multiplier
        )
        self._template = dict(template)
        self._rng = rng if rng is not None else np.random.default_rng()
        self._sums = {n: np.zeros(shape, np.float64) for n, (shape, _) in self._template.items()}
        self._norms: list[float] = []
        self._clients: list[str] = []

    @property
    def clipping_norm(self) -> float:
        if self.adaptive is not None:
            return self.adaptive.clipping_norm
        return self._fixed

    def add(self, client_id: str, update: Weights, weight: float) -> None:
        """Fold in one clipped update (`weight` is ignored: see the module docstring)."""
        if client_id in self._clients:
            raise AggregationError(f"client {client_id!r} was already folded into this aggregate")
        missing = set(self._template) - set(update)
        if missing:
            raise AggregationError(f"client {client_id!r}: update lacks tensors {sorted(missing)}")
        clipped, norm = clip_l2({n: update[n] for n in self._template}, self.clipping_norm)
        for n, acc in self._sums.items():
            acc += clipped[n]  # a mapping in gives a mapping out
        self._norms.append(norm)
        self._clients.append(client_id)

    def result(self) -> Weights:
        """Noised mean over the expected clients; then the adaptive norm takes its step."""
        if not self._clients:
            raise AggregationError("no updates were aggregated")
        std = self._sum_noise * self.clipping_norm
        out = {}
        for n, acc in self._sums.items():
            noisy = acc + self._rng.normal(0.0, std, acc.shape) if std > 0 else acc
            out[n] = (noisy / self.expected_clients).astype(self._template[n][1], copy=False)
        if self.adaptive is not None:
            self.adaptive.update(self._norms, self._rng, expected=self.expected_clients)
        return out

    @property
    def clients(self) -> list[str]:
        return list(self._clients)

    def snapshot(self) -> dict[str, np.ndarray]:
        state = {f"sum/{n}": a for n, a in self._sums.items()}
        state["meta/norms"] = np.asarray(self._norms, np.float64)
        state["meta/clients"] = np.array(self._clients, dtype=np.str_)
        state["meta/clipping_norm"] = np.array(self.clipping_norm, np.float64)
        return state

    def restore(self, snapshot: Mapping[str, np.ndarray]) -> None:
        restore_sums(self._sums, snapshot)
        self._norms = [float(v) for v in snapshot["meta/norms"].tolist()]
        self._clients = [str(c) for c in snapshot["meta/clients"].tolist()]
        if self.adaptive is not None:
            self.adaptive.clipping_norm = float(snapshot["meta/clipping_norm"])
