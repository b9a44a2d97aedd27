"""Exception types of the secure aggregation protocol (sporenet.federated.secagg)."""

from __future__ import annotations

from sporenet.federated.errors import ConfigError, FederatedError


class SecAggError(FederatedError):
    """Base class of every error raised by the secure aggregation protocol."""


class SecAggConfigError(SecAggError, ConfigError):
    """A secure aggregation setting is out of range or inconsistent with the round size."""


class ProtocolError(SecAggError):
    """A message arrived in the wrong stage, twice, from an unknown client or malformed."""


class ThresholdError(SecAggError):
    """Fewer clients than the reconstruction threshold survived a stage: the round fails."""


class ReconstructionError(SecAggError):
    """Shamir reconstruction failed or produced a secret that does not match its commitment."""


class DecryptionError(SecAggError):
    """A relayed share ciphertext failed authentication (tampered, misrouted or wrong key)."""


class UnmaskRefusedError(SecAggError):
    """An honest client refused an unmask request that would expose a peer's input."""
