"""Distributed DP with secure aggregation: every client adds its share of the noise.

The server only sees the secure sum, so no single party needs to add all the noise:
client i clips to L2 norm C and adds N(0, (zC)² / m), where m is the minimum number of
clients whose inputs reach the sum (secagg's threshold, or more). Gaussians add, so a sum
over k >= m survivors carries noise of variance >= (zC)², the central-DP level, while any
single masked upload stays hidden by the masks. Account for it like central DP with
noise multiplier z.

Caveats stated, not hidden: secure aggregation clips each coordinate to its
`clipping_range` and rounds to fixed point after the noise is added. Pick the range from
`suggested_clipping_range` so clipping practically never binds (a bound clip would distort
the Gaussian sum); the rounding adds at most one quantization step per client and
coordinate (continuous Gaussian, not the discrete Gaussian of Kairouz et al. 2021).
"""

from __future__ import annotations

import math

import numpy as np

from sporenet.federated.privacy.clipping import Update, add_gaussian, check_positive, clip_l2
from sporenet.federated.privacy.errors import PrivacyConfigError


class DistributedDP:
    """Client-side clip + a 1/m share of the Gaussian noise, for use before secagg encoding."""

    def __init__(self, *, noise_multiplier: float, clipping_norm: float, min_clients: int) -> None:
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.clipping_norm = check_positive("clipping_norm", clipping_norm)
        if not isinstance(min_clients, int) or min_clients < 1:
            raise PrivacyConfigError(f"`min_clients` must be an int >= 1, found {min_clients!r}")
        self.min_clients = min_clients

    @property
    def client_noise_std(self) -> float:
        """Std of the noise one client adds: zC / sqrt(m)."""
        return self.noise_multiplier * self.clipping_norm / math.sqrt(self.min_clients)

    def privatize(self, update: Update, rng: np.random.Generator) -> Update:
        clipped, _ = clip_l2(update, self.clipping_norm)
        return add_gaussian(clipped, self.client_noise_std, rng)

    def suggested_clipping_range(
        self, num_coordinates: int, failure_probability: float = 1e-9
    ) -> float:
        """A secagg clipping_range that a noised coordinate exceeds with tiny probability.

        |clipped value| <= C, and the noise exceeds t·std with probability <= 2·exp(-t²/2)
        per coordinate; a union bound over all coordinates sets t.
        """
        t = math.sqrt(2 * math.log(2 * num_coordinates / failure_probability))
        return self.clipping_norm + t * self.client_noise_std
