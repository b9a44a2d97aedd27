"""Op codes, re-exported from the IR schema (proto/model.fbs is the single source of truth)."""

from __future__ import annotations

import enum

from sporenet.proto import model_generated as _fb

# The schema's enum as a Python IntEnum; its members are the fields of the generated class.
OpCode = enum.IntEnum(  # type: ignore[misc]
    "OpCode",
    {name: value for name, value in vars(_fb.OpCode).items() if name.isupper()},
)

# Ops whose inputs at these positions must be compile-time constants (shape arguments).
__all__ = ["OpCode"]
