"""Checksums of the bytes a round moves: each model download and each update upload.

They guard against corrupt or mixed-up bytes (a resumed transfer stitched to the wrong
data, a bug on either side); TLS, or TCP on loopback, already guards the bytes in transit.
CRC-32 (zlib's, as zip, gzip and PNG use) does that at about a fifth of sha256's cost,
which every device pays twice per round and the server once per update. A model's sha256
stays its identity (which version a client holds); sha256 is still checked for an update
whose header carries no CRC-32.
"""

from __future__ import annotations

import hashlib
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
    differs = _differs(data, crc, task.model_sha256)
    return f"{differs[0]} {differs[1]} where the task announced {differs[2]}" if differs else ""


def update_mismatch(header: pb.UploadHeader, payload: Bytes) -> str:
    """Why a received update is not the one its header describes ('' when it is, or when
    the header declares no checksum)."""
    crc = header.crc32 if header.HasField("crc32") else None
    differs = _differs(payload, crc, header.sha256 or None)
    if not differs:
        return ""
    return f"update bytes have {differs[0]} {differs[1]}; the upload header declared {differs[2]}"


def _differs(data: Bytes, crc: int | None, sha256: str | None) -> tuple[str, str, str] | None:
    """(checksum, found, declared) when `data` does not match the declared CRC-32, or else
    the declared sha256; None when it does, or when neither is declared."""
    if crc is not None:
        found = crc32(data)
        return None if found == crc else ("CRC-32", f"{found:08x}", f"{crc:08x}")
    if sha256 is None:
        return None
    found_sha = hashlib.sha256(data).hexdigest()
    if found_sha == sha256.lower():
        return None
    return "sha256", f"{found_sha[:16]}...", f"{sha256[:16]}..."
