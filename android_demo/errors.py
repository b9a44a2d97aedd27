"""Exception types of the device app."""

from __future__ import annotations


class AppError(Exception):
    """Base class of the device app's errors."""


class BadRequestError(AppError, ValueError):
    """A request to the JSON API is malformed; the message says what was expected."""


class NotEnoughSamplesError(BadRequestError):
    """Personalization needs more labelled samples than the store holds."""


class ConflictError(AppError):
    """A request is well formed but the app's state does not allow it now (409)."""


class PersonalizationUnavailableError(ConflictError):
    """The model has no head the runtime can train (an int8 head); the message says why."""


class ServerUnreachableError(AppError):
    """The federated server cannot be reached; the message names its address and the error."""
