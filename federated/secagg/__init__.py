"""Secure aggregation in the SecAgg+ family (Bonawitz et al. 2017; Bell et al. 2020).

The server learns the sum of the surviving clients' clipped, fixed-point updates and
nothing about any single one, even when clients drop out mid-round.

- config: SecAggConfig (operator settings) -> RoundParams (resolved for n clients)
- client / server: the two state machines; messages: their wire forms
- crypto, prg, shamir, decoding, encoding, graph: the building blocks
- session: the same round in the daemon's terms (client ids, named tensors, bytes)
- simulation: an in-process driver for tests and benchmarks

Threat model (docs/threat_model.md): an honest-but-curious server and clients that may
be malicious. The server relays the clients' public keys, so a server that substitutes
keys is out of scope (that needs signed keys and SecAgg's consistency-check round,
neither implemented here). The sum of fewer than `threshold` clients is never released.
A client that advertises a low-order key, or sends shares that decoding locates as bad,
is excluded by name (`SecAggServer.excluded`); a malicious input is not bound by
`clipping_range`, only the unmasked sum is held to what clipped inputs can add up to.

Wiring into sporenet-server (federated/server/rounds.py; `[secure_aggregation]` in the
server config, federated/README.md): a secure fit phase holds a `SecureRound` instead of
an Aggregator; `Task` (TASK_SECURE_FIT) carries the stage, `setup_payload(client)` and
`payload_for(client)`; the SubmitSecure RPC carries a client's reply to `submit`; the
round loop calls `close_stage()` when `pending()` is empty, every pending client has been
silent for heartbeat_timeout, or the stage deadline passes, saves `to_bytes()` in SQLite
at every transition and every `checkpoint_every` messages, and publishes `result()`
through the strategy. ProtocolError maps to INVALID_ARGUMENT; ThresholdError fails the
round and the job (late messages then get FAILED_PRECONDITION naming the reason).
Exclusions: `submit` raises ClientExcludedError (a ProtocolError; `client` is the id)
when a message gets its sender excluded, and `close_stage()` of the unmask stage may
exclude holders of bad shares; `excluded()` names them all (id -> reason, persisted), so
the round loop logs one event per id it has not reported yet.
tests/integration/federated/test_secure_rounds.py runs the real daemon and clients;
tests/integration/secagg keeps the standalone loopback harness.
"""

from sporenet.federated.secagg.client import SecAggClient
from sporenet.federated.secagg.config import RoundParams, SecAggConfig
from sporenet.federated.secagg.errors import (
    ClientExcludedError,
    DecryptionError,
    InvalidKeyError,
    ProtocolError,
    ReconstructionError,
    SecAggConfigError,
    SecAggError,
    ThresholdError,
    UnmaskRefusedError,
)
from sporenet.federated.secagg.server import SecAggResult, SecAggServer, Stage

__all__ = [
    "ClientExcludedError",
    "DecryptionError",
    "InvalidKeyError",
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
