"""Checksums of model downloads and update uploads (federated/common/checksum.py)."""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
import pytest

from sporenet.federated.common.checksum import crc32, model_mismatch, update_mismatch
from sporenet.proto import federated_pb2 as pb

DATA = np.random.default_rng(0).bytes(100_003)
FLIPPED = DATA[:500] + bytes([DATA[500] ^ 0x10]) + DATA[501:]


def test_crc32_is_zlibs_unsigned_crc_for_every_buffer_type() -> None:
    expected = zlib.crc32(DATA)
    assert crc32(DATA) == crc32(bytearray(DATA)) == crc32(memoryview(DATA)) == expected
    assert 0 <= crc32(b"\xff" * 9) < 2**32
    assert crc32(FLIPPED) != expected


def _task(data: bytes, *, with_crc: bool) -> pb.Task:
    task = pb.Task(model_size=len(data), model_sha256=hashlib.sha256(data).hexdigest())
    if with_crc:
        task.model_crc32 = zlib.crc32(data)
    return task


@pytest.mark.parametrize("with_crc", [True, False])
def test_model_mismatch_accepts_the_announced_bytes(with_crc: bool) -> None:
    assert model_mismatch(_task(DATA, with_crc=with_crc), memoryview(DATA)) == ""


def test_model_mismatch_names_what_differs() -> None:
    task = _task(DATA, with_crc=True)
    assert (
        model_mismatch(task, DATA[:-1])
        == f"{len(DATA) - 1} bytes where the task announced {len(DATA)}"
    )
    assert model_mismatch(task, FLIPPED) == (
        f"CRC-32 {zlib.crc32(FLIPPED):08x} where the task announced {zlib.crc32(DATA):08x}"
    )
    # A server that sends no CRC-32: nothing to check beyond the size.
    assert model_mismatch(_task(DATA, with_crc=False), FLIPPED) == ""


def test_update_mismatch_checks_the_declared_crc32_only() -> None:
    by_crc = pb.UploadHeader(crc32=zlib.crc32(DATA))
    assert update_mismatch(by_crc, DATA) == ""
    assert update_mismatch(by_crc, FLIPPED) == (
        f"update bytes have CRC-32 {zlib.crc32(FLIPPED):08x}; the upload header declared "
        f"{zlib.crc32(DATA):08x}"
    )
    # A CRC-32 of zero is a declared value, not an absent field.
    assert update_mismatch(pb.UploadHeader(crc32=0), DATA).endswith("declared 00000000")
    # No CRC-32 declared: nothing to check (a sha256 alone is not a checksum here).
    assert update_mismatch(pb.UploadHeader(sha256="00" * 32), FLIPPED) == ""
    assert update_mismatch(pb.UploadHeader(), FLIPPED) == ""
