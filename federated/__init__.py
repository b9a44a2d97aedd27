"""sporenet.federated: the federated-learning client SDK, strategies and the sporenet-server daemon.

The client side is `Client` (register, train with your callable, upload); the server side
is `sporenet-server` (sporenet.federated.server). Strategies live in
sporenet.federated.strategies, the aggregation stage in sporenet.federated.aggregation.
"""

from sporenet.federated.aggregation import Aggregator, BufferedAggregator, WeightedMeanAggregator
from sporenet.federated.client import Client
from sporenet.federated.common.auth import Credentials
from sporenet.federated.errors import (
    AggregationError,
    AuthError,
    ConfigError,
    FederatedError,
    JobFailedError,
    UpdateRejectedError,
)

__all__ = [
    "AggregationError",
    "Aggregator",
    "AuthError",
    "BufferedAggregator",
    "Client",
    "ConfigError",
    "Credentials",
    "FederatedError",
    "JobFailedError",
    "UpdateRejectedError",
    "WeightedMeanAggregator",
]
