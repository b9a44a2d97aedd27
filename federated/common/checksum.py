"""Checksums of the bytes a round moves: each model download and each update upload.

They guard against corrupt or mixed-up bytes (a resumed transfer stitched to the wrong
data, a bug on either side); TLS, or TCP on loopback, already guards the bytes in transit.
CRC-32 (zlib's, as zip, gzip and PNG use) does that cheaply, and every device pays it
twice per round. A model's sha256 stays its identity (which version a client holds).
"""

from __future__ import annotations

import zlib

from sporenet.proto import federated_pb2 as pb

Bytes = bytes | bytearray | memoryview


def crc32(data: Bytes) -> int:
    """The CRC-32 that `Task.model_crc32` and `UploadHeader.crc32` carry."""
    return zlib.crc32(data) & 0xFFFFFFFF


def model_mismatch(task: pb.Task, data: Bytes) -> str:
    """Why downloaded model bytes are not the task's model ('' when they are)."""
    if len(data) != task.model_size:
        return f"{len(data)} bytes where the task announced {task.model_size}"
    crc = task.model_crc32 if task.HasField("model_crc32") else None
    differs = _differs(data, crc)
    return f"CRC-32 {differs[0]} where the task announced {differs[1]}" if differs else ""


def update_mismatch(header: pb.UploadHeader, payload: Bytes) -> str:
    """Why a received update is not the one its header describes ('' when it is, or when
    the header declares no CRC-32)."""
    crc = header.crc32 if header.HasField("crc32") else None
    differs = _differs(payload, crc)
    if not differs:
        return ""
    return f"update bytes have CRC-32 {differs[0]}; the upload header declared {differs[1]}"


def _differs(data: Bytes, crc: int | None) -> tuple[str, str] | None:
    """(found, declared) when `data` does not match the declared CRC-32; None when it
    does, or when none is declared."""
    if crc is None:
        return None
    found = crc32(data)
    return None if found == crc else (f"{found:08x}", f"{crc:08x}")
