"""Reading and writing .spore files: the FlatBuffer root plus an aligned weight segment.

The public entry point: writing lives in format_write.py, hostile-input reading in
format_read.py, and the layout constants in format_layout.py.
"""

from __future__ import annotations

from sporenet.lite.format_layout import (
    ALIGNMENT,
    FILE_EXTENSION,
    FILE_IDENTIFIER,
    SCHEMA_VERSION,
    Source,
)
from sporenet.lite.format_read import load, parse
from sporenet.lite.format_write import _align, _Writer, save, serialize

__all__ = [
    "ALIGNMENT",
    "FILE_EXTENSION",
    "FILE_IDENTIFIER",
    "SCHEMA_VERSION",
    "Source",
    "_Writer",
    "_align",
    "load",
    "parse",
    "save",
    "serialize",
]
