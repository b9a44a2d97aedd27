"""The client's upload with the update riding with its header, against fake sessions: a
server that takes it, one that drops it (upload_offset), and one from before riding data
(refused with INVALID_ARGUMENT: the client sends the header alone from then on)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from sporenet.federated.client.transfers import PendingUpload, Transfers
from sporenet.federated.common.wire import SessionReplyField, SessionRequestField
from sporenet.proto import federated_pb2 as pb

PAYLOAD = bytes(range(256)) * 40  # 10,240 bytes


class Refusal(grpc.RpcError):
    """The status an older server ends the stream with."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return (
            "a Session upload starts with an UploadChunk that carries only the header; "
            "found data with it"
        )


class FakeSession:
    """A Session the way a server answers uploads: `mode` is "take" (the riding data
    is taken), "drop" (upload_offset 0 first) or "old" (data with the header refused)."""

    def __init__(self, mode: str) -> None:
        self.mode, self.closed = mode, False
        self.chunks: list[pb.UploadChunk] = []

    async def send(self, field: int, message: bytes) -> None:
        assert field == SessionRequestField.UPLOAD
        self.chunks.append(pb.UploadChunk.FromString(message))

    async def send_framed(self, request: bytes) -> None:
        self.chunks.append(pb.SessionRequest.FromString(request).upload)

    async def receive(self, expected: Any, timeout: float) -> tuple[int, memoryview]:
        first = self.chunks[0]
        received = sum(len(c.data) for c in self.chunks)
        if len(self.chunks) == 1 and first.data and self.mode == "old":
            self.closed = True
            raise Refusal()
        if len(self.chunks) == 1 and (not first.data or self.mode == "drop"):
            offer = pb.UploadOffsetReply(received=0).SerializeToString()
            return SessionReplyField.UPLOAD_OFFSET, memoryview(offer)
        got = b"".join(c.data for c in self.chunks[1:] or self.chunks)
        assert got == PAYLOAD and received >= len(PAYLOAD)
        reply = pb.UploadReply(accepted=True, received=len(PAYLOAD)).SerializeToString()
        return SessionReplyField.UPLOAD_REPLY, memoryview(reply)


def _upload(mode: str, chunk_size: int = 1 << 16) -> tuple[Transfers, list[FakeSession]]:
    sessions: list[FakeSession] = []

    def open_session() -> FakeSession:
        if not sessions or sessions[-1].closed:
            sessions.append(FakeSession(mode))
        return sessions[-1]

    transfers = Transfers(
        run=asyncio.run,
        open_session=open_session,  # type: ignore[arg-type]
        client_id=lambda: "c1",
        chunk_size=chunk_size,
        download_chunk_size=0,
        rpc_timeout=5.0,
    )
    transfers.upload(PendingUpload("t1", "u1", PAYLOAD, 10, "{}"))
    return transfers, sessions


def test_an_update_that_fits_rides_with_its_header() -> None:
    transfers, sessions = _upload("take")
    assert len(sessions) == 1 and len(sessions[0].chunks) == 1
    first = sessions[0].chunks[0]
    assert first.header.total_size == len(PAYLOAD) and first.data == PAYLOAD
    assert transfers.ride


def test_a_dropped_update_is_sent_again_from_the_offset() -> None:
    _, sessions = _upload("drop", chunk_size=1 << 16)
    chunks = sessions[0].chunks
    assert chunks[0].data == PAYLOAD and chunks[1].offset == 0 and chunks[1].data == PAYLOAD


def test_an_update_bigger_than_a_chunk_goes_after_the_header() -> None:
    _, sessions = _upload("take", chunk_size=4096)
    chunks = sessions[0].chunks
    assert not chunks[0].data and [c.offset for c in chunks[1:]] == [0, 4096, 8192]


def test_a_server_from_before_riding_gets_the_header_alone() -> None:
    transfers, sessions = _upload("old")
    assert len(sessions) == 2 and sessions[0].chunks[0].data == PAYLOAD
    assert not sessions[1].chunks[0].data and sessions[1].chunks[1].data == PAYLOAD
    assert not transfers.ride  # and from then on


def test_other_refusals_are_not_retried() -> None:
    class Bad(Refusal):
        def details(self) -> str:
            return "NaN or infinite"

    class BadSession(FakeSession):
        async def receive(self, expected: Any, timeout: float) -> tuple[int, memoryview]:
            raise Bad()

    transfers = Transfers(
        run=asyncio.run,
        open_session=lambda: BadSession("take"),  # type: ignore[arg-type]
        client_id=lambda: "c1",
        chunk_size=1 << 16,
        download_chunk_size=0,
        rpc_timeout=5.0,
    )
    with pytest.raises(Bad):
        transfers.upload(PendingUpload("t1", "u1", PAYLOAD, 10, "{}"))
    assert transfers.ride
