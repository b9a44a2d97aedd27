"""Aggregation strategies, one per module, behind `Strategy`; `make_strategy` builds one by name."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from sporenet.federated.errors import ConfigError
from sporenet.federated.strategies.base import Strategy
from sporenet.federated.strategies.fedadagrad import FedAdagrad
from sporenet.federated.strategies.fedadam import FedAdam
from sporenet.federated.strategies.fedavg import FedAvg, weighted_mean
from sporenet.federated.strategies.fedavgm import FedAvgM
from sporenet.federated.strategies.fedopt import fedopt_step
from sporenet.federated.strategies.fedprox import FedProx
from sporenet.federated.strategies.fedyogi import FedYogi
from sporenet.federated.strategies.krum import Krum, krum, krum_scores
from sporenet.federated.strategies.median import Median, coordinate_median
from sporenet.federated.strategies.trimmed_mean import TrimmedMean, trimmed_mean

STRATEGIES: dict[str, type[Strategy]] = {
    "fedavg": FedAvg,
    "fedavgm": FedAvgM,
    "fedprox": FedProx,
    "fedadam": FedAdam,
    "fedyogi": FedYogi,
    "fedadagrad": FedAdagrad,
    "trimmed_mean": TrimmedMean,
    "median": Median,
    "krum": Krum,
}


def make_strategy(name: str, options: Mapping[str, Any] | None = None) -> Strategy:
    """The strategy `name` built with keyword `options`; bad names or options raise ConfigError."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; supported: {sorted(STRATEGIES)}")
    cls = STRATEGIES[name]
    options = dict(options or {})
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = inspect.signature(cls.__init__).parameters.values()
    accepted = [p.name for p in params if p.name != "self" and p.kind in named]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        takes = f"it accepts {accepted}" if accepted else "it takes no options"
        raise ConfigError(f"strategy {name!r} has no option(s) {unknown}; {takes}")
    try:
        return cls(**options)
    except TypeError as e:  # a value of the wrong type for an option
        raise ConfigError(f"strategy {name!r}: {e}") from None


__all__ = [
    "STRATEGIES",
    "FedAdagrad",
    "FedAdam",
    "FedAvg",
    "FedAvgM",
    "FedProx",
    "FedYogi",
    "Krum",
    "Median",
    "Strategy",
    "TrimmedMean",
    "coordinate_median",
    "fedopt_step",
    "krum",
    "krum_scores",
    "make_strategy",
    "trimmed_mean",
    "weighted_mean",
]
