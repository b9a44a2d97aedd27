"""The client's model downloads and update uploads over its Session stream.

`Transfers` owns what moving bytes needs: the model held, a download in progress (resumed
from the last byte received), the pooled buffers models and updates land in, and the
chunking, CRC-32 and acknowledgement of an upload. The `Client` decides when to transfer
and handles failures; the coroutines here run on its transport loop.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import grpc

from sporenet.federated.client.session_stream import SessionStream
from sporenet.federated.common.buffers import BufferPool
from sporenet.federated.common.checksum import crc32, model_mismatch
from sporenet.federated.common.wire import (
    SessionReplyField,
    SessionRequestField,
    encode_upload_chunk,
    split_model_chunk,
)
from sporenet.federated.errors import TransferError
from sporenet.proto import federated_pb2 as pb

# A session upload waits for the server's go-ahead up to this many `rpc_timeout`s: the
# server grants a few receiving slots at a time, so with a whole fleet uploading at once
# a client's turn can take long.
UPLOAD_WAIT_FACTOR = 10


@dataclass
class PendingUpload:
    """An update computed for `task_id` and not yet acknowledged."""

    task_id: str
    upload_id: str
    payload: bytes | bytearray | memoryview
    num_samples: int
    metrics_json: str
    crc32: int | None = None  # of `payload`, computed on the first attempt to upload it


def _refuses_riding(error: grpc.RpcError) -> bool:
    """Whether a server from before riding data refused an update sent with its header."""
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else "") or ""
    return code == grpc.StatusCode.INVALID_ARGUMENT and details.endswith("found data with it")


def check_accepted(reply: pb.UploadReply, p: PendingUpload) -> None:
    """TransferError (resume and send the rest) unless the server accepted the upload."""
    if not reply.accepted:
        raise TransferError(
            f"upload stopped at byte {reply.received} of {len(p.payload)}: {reply.message}"
        )


class Transfers:
    """One client's downloads and uploads: models held, a partial download, buffers."""

    def __init__(
        self,
        *,
        run: Callable[[Coroutine[Any, Any, Any]], Any],
        open_session: Callable[[], SessionStream],
        client_id: Callable[[], str],
        chunk_size: int,
        download_chunk_size: int,
        rpc_timeout: float,
    ) -> None:
        """Transfers over the session `open_session()` returns, in coroutines that `run`
        executes on the client's transport loop, as the client `client_id()` names;
        settings as the `Client`'s."""
        self._run, self._open_session, self._client_id = run, open_session, client_id
        self.chunk_size, self.download_chunk_size = chunk_size, download_chunk_size
        self.rpc_timeout = rpc_timeout
        self.ride = True  # an update that fits in one chunk goes with its header
        self.models: dict[int, tuple[str, memoryview]] = {}  # version -> (sha256, bytes)
        # A download in progress: (version, buffer of the model's size, bytes received).
        self.partial: tuple[int, memoryview, int] | None = None
        # The buffers of the last model and update, reused for the next round's: a fresh
        # model-sized one costs a page fault per 4 KiB (and zeroing), more than filling it.
        self.buffers = BufferPool(limit=2)

    # -- downloads -------------------------------------------------------------------------

    def held_sha256(self) -> str:
        """The SHA-256 of the model held ("" when none)."""
        return next(iter(self.models.values()))[0] if self.models else ""

    def model_bytes(self, task: pb.Task) -> memoryview:
        """The task's model, downloaded once (resuming a partial download) and checked."""
        cached = self.models.get(task.model_version)
        if cached is not None and cached[0] == task.model_sha256:
            return cached[1]
        partial = self.start_download(task)
        if partial[2] < task.model_size:
            self._run(self.download_in_session(task, requested=False))
        _, data, received = self.partial or partial
        self.partial = None
        mismatch = model_mismatch(task, data[:received])
        if mismatch:
            self.buffers.give(data)
            raise TransferError(
                f"model v{task.model_version} downloaded with {mismatch}; downloading again"
            )
        # Keep only the newest version: a fleet simulation runs many clients in one process.
        self.drop_models()
        self.models = {task.model_version: (task.model_sha256, data)}
        return data

    def drop_models(self) -> None:
        """Forget the models held; their buffers serve the next download or update."""
        for _, data in self.models.values():
            self.buffers.give(data)
        self.models = {}

    def start_download(self, task: pb.Task) -> tuple[int, memoryview, int]:
        """The download of the task's model in progress: (version, buffer, bytes received).

        Chunks land in one buffer of the announced size (no appends, no final copy);
        `received` bytes of it are valid, so an interrupted download resumes there.
        """
        if self.partial is None or self.partial[0] != task.model_version:
            self.partial = (task.model_version, self.buffers.take(task.model_size), 0)
        return self.partial

    def take_chunk(self, at: int, piece: memoryview) -> int:
        """Place a downloaded chunk that starts at byte `at`; the bytes received now."""
        if self.partial is None:
            raise TransferError("a model chunk arrived with no download in progress")
        version, buf, received = self.partial
        if not piece:
            raise TransferError(f"empty download chunk at offset {at}")
        if at != received:
            raise TransferError(f"download chunk at offset {at}, expected {received}")
        if at + len(piece) > len(buf):
            raise TransferError(f"download runs past the model's announced {len(buf)} bytes")
        buf[at : at + len(piece)] = piece
        self.partial = (version, buf, at + len(piece))
        return at + len(piece)

    def download_request(self, task: pb.Task) -> pb.DownloadRequest:
        return pb.DownloadRequest(
            client_id=self._client_id(),
            model_version=task.model_version,
            offset=self.start_download(task)[2],
            chunk_size=self.download_chunk_size,
        )

    async def download_in_session(self, task: pb.Task, *, requested: bool) -> None:
        """Receive the rest of the task's model over the session (asking for it first,
        unless the poll already did)."""
        session = self._open_session()
        if not requested:
            request = self.download_request(task)
            await session.send(SessionRequestField.DOWNLOAD, request.SerializeToString())
        received = self.start_download(task)[2]
        while received < task.model_size:
            _, body = await session.receive((SessionReplyField.MODEL,), self.rpc_timeout)
            at, piece, _ = split_model_chunk(body)
            received = self.take_chunk(at, piece)

    # -- uploads ---------------------------------------------------------------------------

    def upload(self, p: PendingUpload) -> None:
        """Send the update `p` (resuming where the server says it stopped) and see it
        accepted; TransferError if it was not."""
        self._run(self.upload_in_session(p, self.upload_header(p)))

    def upload_header(self, p: PendingUpload) -> pb.UploadHeader:
        """The upload's first message (its CRC-32 computed once, on the caller's thread)."""
        if p.crc32 is None:
            p.crc32 = crc32(p.payload)
        return pb.UploadHeader(
            client_id=self._client_id(),
            task_id=p.task_id,
            upload_id=p.upload_id,
            total_size=len(p.payload),
            crc32=p.crc32,
            num_samples=p.num_samples,
            metrics_json=p.metrics_json,
        )

    async def upload_in_session(self, p: PendingUpload, header: pb.UploadHeader) -> bool:
        """Send the update over the session (its CRC-32 computed beforehand, off the loop);
        whether a task reply follows (the server took the poll that `header.then_poll_ms`
        asks for: the client reads its answer next, and sends no poll).

        An update that fits in one chunk rides with its header: a server with a free slot
        takes it and answers upload_reply alone. Otherwise (or when the server drops it:
        no slot free, or it holds part of this upload) the server answers upload_offset
        and the rest goes from there, as after a header-only chunk. A server from before
        riding data refuses it; the header then goes alone, on a new session, from then on.
        """
        ride = self.ride and 0 < len(p.payload) <= self.chunk_size
        try:
            return await self._upload_from_header(p, header, ride=ride)
        except grpc.RpcError as e:
            if not (ride and _refuses_riding(e)):
                raise
            self.ride = False
            return await self._upload_from_header(p, header, ride=False)

    async def _upload_from_header(
        self, p: PendingUpload, header: pb.UploadHeader, *, ride: bool
    ) -> bool:
        session = self._open_session()
        whole = bytes(p.payload) if ride else b""
        first = pb.UploadChunk(header=header, offset=0, data=whole).SerializeToString()
        await session.send(SessionRequestField.UPLOAD, first)
        # The server answers when it has a slot for this upload: with a whole fleet
        # uploading at once that may take a while, and costs neither side anything.
        field, body = await session.receive(
            (SessionReplyField.UPLOAD_OFFSET, SessionReplyField.UPLOAD_REPLY),
            self.rpc_timeout * UPLOAD_WAIT_FACTOR,
        )
        if field == SessionReplyField.UPLOAD_OFFSET:
            pos = pb.UploadOffsetReply.FromString(bytes(body)).received
            view = memoryview(p.payload)
            while pos < len(p.payload):
                data = view[pos : pos + self.chunk_size]
                await session.send_framed(encode_upload_chunk(pos, data, session=True))
                pos += len(data)
            _, body = await session.receive(
                (SessionReplyField.UPLOAD_REPLY,), self.rpc_timeout + len(p.payload) / 5e6
            )
        reply = pb.UploadReply.FromString(bytes(body))
        check_accepted(reply, p)
        return reply.task_follows
