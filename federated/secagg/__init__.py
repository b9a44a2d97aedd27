"""Secure aggregation in the SecAgg+ family (Bonawitz et al. 2017; Bell et al. 2020).

The server learns the sum of the surviving clients' clipped, fixed-point updates and
nothing about any single one, even when clients drop out mid-round.

- config: SecAggConfig (operator settings) -> RoundParams (resolved for n clients)
- client / server: the two state machines; messages: their wire forms
- crypto, prg, shamir, encoding, graph: the building blocks
- simulation: an in-process driver for tests and benchmarks
"""

from sporenet.federated.secagg.client import SecAggClient
from sporenet.federated.secagg.config import RoundParams, SecAggConfig
from sporenet.federated.secagg.errors import (
    DecryptionError,
    ProtocolError,
    ReconstructionError,
    SecAggConfigError,
    SecAggError,
    ThresholdError,
    UnmaskRefusedError,
)
from sporenet.federated.secagg.server import SecAggResult, SecAggServer, Stage

__all__ = [
    "DecryptionError",
    "ProtocolError",
    "ReconstructionError",
    "RoundParams",
    "SecAggClient",
    "SecAggConfig",
    "SecAggConfigError",
    "SecAggError",
    "SecAggResult",
    "SecAggServer",
    "Stage",
    "ThresholdError",
    "UnmaskRefusedError",
]
