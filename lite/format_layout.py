"""Constants of the .spore layout, shared by the writer and the reader."""

from __future__ import annotations

import os

FILE_IDENTIFIER = b"SPOR"
FILE_EXTENSION = ".spore"
SCHEMA_VERSION = 1
ALIGNMENT = 64
MAX_RANK = 16

Source = str | os.PathLike | bytes | bytearray | memoryview
