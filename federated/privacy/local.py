"""Local DP: each client clips its update and adds Gaussian noise before it leaves.

The server (and anyone else) only ever sees a noised update, so each release is
(epsilon, delta)-DP for that client on its own. The noise follows the classic Gaussian
mechanism, sigma = C·sqrt(2 ln(1.25/δ))/ε (Dwork & Roth, Theorem A.1; valid for ε <= 1),
unless a noise multiplier is given directly. Expect much more noise than central DP.
"""

from __future__ import annotations

import math

import numpy as np

from sporenet.federated.privacy.clipping import Update, add_gaussian, check_positive, clip_l2
from sporenet.federated.privacy.errors import PrivacyConfigError


class LocalDP:
    """Client-side clip + Gaussian noise, sized by (epsilon, delta) or a noise multiplier."""

    def __init__(
        self,
        *,
        clipping_norm: float,
        epsilon: float | None = None,
        delta: float | None = None,
        noise_multiplier: float | None = None,
    ) -> None:
        self.clipping_norm = check_positive("clipping_norm", clipping_norm)
        if noise_multiplier is not None:
            if epsilon is not None or delta is not None:
                raise PrivacyConfigError("give either `noise_multiplier` or (`epsilon`, `delta`)")
            self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        else:
            if epsilon is None or delta is None:
                raise PrivacyConfigError("give (`epsilon`, `delta`) or `noise_multiplier`")
            eps = check_positive("epsilon", epsilon)
            if eps > 1.0:
                raise PrivacyConfigError(
                    f"`epsilon` must be <= 1 for the classic Gaussian mechanism, found {epsilon}"
                )
            if not (isinstance(delta, float) and 0.0 < delta < 1.0):
                raise PrivacyConfigError(f"`delta` must be a float in (0, 1), found {delta!r}")
            self.noise_multiplier = math.sqrt(2 * math.log(1.25 / delta)) / eps

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.clipping_norm

    def privatize(self, update: Update, rng: np.random.Generator) -> Update:
        """A clipped, noised copy of the update (dict in, dict out)."""
        clipped, _ = clip_l2(update, self.clipping_norm)
        return add_gaussian(clipped, self.noise_std, rng)
