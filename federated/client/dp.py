"""Client-side differential privacy: clip and noise a delta before it leaves the device.

The task config says which: `dp_local_noise_multiplier` (local DP: all of the noise) or
`dp_noise_multiplier` with `dp_min_clients` (distributed DP: this client's share of the
noise of a secure sum). Both need `dp_clipping_norm`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from sporenet.federated.aggregation import Weights
from sporenet.federated.privacy import DistributedDP, LocalDP
from sporenet.proto import federated_pb2 as pb


def privatize(config: Mapping[str, Any], delta: Weights) -> Weights:
    """Clip the delta and add noise when the task config asks for client-side DP: all of it
    (local DP) or this client's share of it (distributed DP: the server sees only the
    secure sum, whose noise is the sum of the shares). Same dtypes as `delta`."""
    mech: LocalDP | DistributedDP
    if "dp_local_noise_multiplier" in config:
        mech = LocalDP(
            noise_multiplier=config["dp_local_noise_multiplier"],
            clipping_norm=config["dp_clipping_norm"],
        )
    elif "dp_noise_multiplier" in config:
        mech = DistributedDP(
            noise_multiplier=config["dp_noise_multiplier"],
            clipping_norm=config["dp_clipping_norm"],
            min_clients=config["dp_min_clients"],
        )
    else:
        return delta
    # OS entropy: noise the server could predict would protect nothing.
    noised = cast(Weights, mech.privatize(delta, np.random.default_rng()))  # dict in, dict out
    return {k: np.asarray(v, dtype=delta[k].dtype) for k, v in noised.items()}


def asks_client_dp(config: Mapping[str, Any]) -> bool:
    """Whether the task asks the client to clip and noise its delta (see `privatize`)."""
    return "dp_local_noise_multiplier" in config or "dp_noise_multiplier" in config


def privatize_secure(task: pb.Task, trained: tuple[Weights, int, str]) -> tuple[Weights, int, str]:
    """`privatize` for a secure round's (delta, samples, metrics)."""
    delta, num_samples, metrics_json = trained
    return privatize(json.loads(task.config_json or "{}"), delta), num_samples, metrics_json
