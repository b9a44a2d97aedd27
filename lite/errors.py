"""Exception types of the on-device runtime."""

from __future__ import annotations


class LiteError(Exception):
    """Base class of every error raised by sporenet.lite."""


class ModelFormatError(LiteError):
    """A model file or in-memory model is malformed, truncated or inconsistent."""


class UnsupportedOpError(LiteError):
    """The model uses an op (or op version) this runtime has no kernel for."""


class SignatureError(ModelFormatError, KeyError):
    """The model has no signature (entry point) of the requested name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ShapeError(ModelFormatError, ValueError):
    """Tensor shapes, dtypes or attributes are inconsistent for an op."""


class ValueNeededError(ShapeError):
    """A kernel needs, to plan, the value of a tensor that is known only at run time (a
    target shape or sizes fed as a graph input)."""


class InputError(LiteError, ValueError):
    """A caller passed an input with the wrong name, shape or dtype."""
