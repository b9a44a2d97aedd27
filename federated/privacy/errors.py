"""Exception types of differential privacy (sporenet.federated.privacy)."""

from __future__ import annotations

from sporenet.federated.errors import ConfigError, FederatedError


class PrivacyError(FederatedError):
    """Base class of every error raised by sporenet.federated.privacy."""


class PrivacyConfigError(PrivacyError, ConfigError):
    """A privacy setting (noise, clipping, sampling rate, delta, budget) is out of range."""


class PrivacyBudgetExhaustedError(PrivacyError):
    """Another round would spend more epsilon than the budget allows: training must stop."""
