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
    if task.HasField("model_crc32"):
        found = crc32(data)
        if found != task.model_crc32:
            return f"CRC-32 {found:08x} where the task announced {task.model_crc32:08x}"
        return ""
    found_sha = hashlib.sha256(data).hexdigest()
    if found_sha != task.model_sha256:
        return f"sha256 {found_sha[:16]}... where the task announced {task.model_sha256[:16]}..."
    return ""


def update_mismatch(header: pb.UploadHeader, payload: Bytes) -> str:
    """Why a received update is not the one its header describes ('' when it is, or when
    the header declares no checksum)."""
    if header.HasField("crc32"):
        found = crc32(payload)
        if found != header.crc32:
            return (
                f"update bytes have CRC-32 {found:08x}; the upload header declared "
                f"{header.crc32:08x}"
            )
        return ""
    if header.sha256:
        found_sha = hashlib.sha256(payload).hexdigest()
        if found_sha != header.sha256.lower():
            return (
                f"update bytes have sha256 {found_sha[:16]}...; the upload header declared "
                f"{header.sha256[:16]}..."
            )
    return ""
