"""Exception types of the device app."""

from __future__ import annotations


class AppError(Exception):
    """Base class of the device app's errors."""


class BadRequestError(AppError, ValueError):
    """A request to the JSON API is malformed; the message says what was expected."""


class NotEnoughSamplesError(BadRequestError):
    """Personalization needs more labelled samples than the store holds."""
