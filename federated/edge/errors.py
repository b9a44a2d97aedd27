"""Exception types of the edge aggregator (sporenet.federated.edge)."""

from __future__ import annotations

from sporenet.federated.errors import FederatedError


class EdgeError(FederatedError):
    """Base class of the edge aggregator's errors."""


class EdgeRefusedError(EdgeError):
    """The cloud refused this edge (its job cannot be aggregated in tiers, or the edge's
    credentials): the message is the cloud's reason."""
