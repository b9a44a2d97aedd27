"""Exception types of sporenet.cloud."""

from __future__ import annotations


class CloudError(Exception):
    """Base class of every error raised by sporenet.cloud."""


class ConfigError(CloudError, ValueError):
    """A layer, optimizer, callback or training argument is invalid (the message names it)."""


class TraceError(CloudError):
    """A model could not be run or traced into the IR (wrong input, unsupported construct)."""


class CheckpointError(CloudError):
    """A checkpoint file is missing, malformed or does not match the model."""


class ExportError(CloudError):
    """A model could not be exported to an inference .spore file."""


class DatasetError(CloudError):
    """A dataset's files are missing or malformed (the message says how to get them)."""
