"""Differential privacy for federated rounds.

- central: server-side clipping + Gaussian noise (an Aggregator), fixed or adaptive norm
- local: client-side clipping + noise on every update
- distributed: each client adds its share of the noise under secure aggregation
- accountant: Rényi DP of the subsampled Gaussian (fixed-size cohorts without
  replacement, or Poisson), epsilon for a delta, budget stop
"""

from sporenet.federated.privacy.accountant import (
    RDPAccountant,
    rdp_sampled_gaussian,
    rdp_without_replacement,
)
from sporenet.federated.privacy.central import CentralDPAggregator
from sporenet.federated.privacy.clipping import AdaptiveClipping, clip_l2, l2_norm
from sporenet.federated.privacy.distributed import DistributedDP
from sporenet.federated.privacy.errors import (
    PrivacyBudgetExhaustedError,
    PrivacyConfigError,
    PrivacyError,
)
from sporenet.federated.privacy.local import LocalDP

__all__ = [
    "AdaptiveClipping",
    "CentralDPAggregator",
    "DistributedDP",
    "LocalDP",
    "PrivacyBudgetExhaustedError",
    "PrivacyConfigError",
    "PrivacyError",
    "RDPAccountant",
    "clip_l2",
    "l2_norm",
    "rdp_sampled_gaussian",
    "rdp_without_replacement",
]
