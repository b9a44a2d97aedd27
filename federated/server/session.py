"""The calls served on the asyncio event loop: polls, Session streams, secure messages.

Transport-neutral: a call gets plain requests and a `Stream` to read and write, and raises
the domain errors of errors.py; servicer.py adapts gRPC to it (contexts, status codes),
and the interceptor has already authenticated the caller and checked that its requests
act only for its own client.

- a poll (the unary Poll of idle clients, or one on a Session) may wait as a coroutine,
  woken when the RoundManager says tasks may have changed; its TASK_WAIT answer carries
  the pause the PollPacer chose;
- a Session carries a working client's download, upload and heartbeats over one stream;
  a download sends the model's chunks, encoded once per version for every client;
- an upload waits for a receiving slot before the client sends a byte (so waiting
  clients hold no more payload than the slots may), is received into one buffer, checked,
  validated, written and folded: on a worker thread, since those block, unless the
  update is small enough that the hand-off would cost more. An update that fits in one
  chunk rides with its header: taken at once when a slot is free (no upload_offset
  message), else kept while it waits if the waiting ones hold no more than the slots may
  (a dropped one is asked for again once the slot is granted, and the slot waits a round
  trip for it: under load, every upload would then hold its slot that long). A header may
  carry the client's next poll (`then_poll_ms`): the accepted update's reply says it
  follows, and the poll is answered next, with no poll message from the client.

The RoundManager stays the single source of truth; this module is only a transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sporenet.federated.common.buffers import BufferPool
from sporenet.federated.common.wire import (
    STAGE_NAMES,
    SessionReplyField,
    SessionRequestField,
    encode_model_chunk,
    frame_session,
    split_first_upload_chunk,
    split_session,
    split_upload_chunk,
)
from sporenet.federated.errors import (
    FederatedError,
    MalformedMessageError,
    ReadTimeoutError,
    StaleTaskError,
    SupersededError,
    TransferError,
    UnknownClientError,
    UpdateRejectedError,
)
from sporenet.federated.server.encoded import EncodedTasks, ModelChunks
from sporenet.federated.server.interceptor import Refused
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.pacing import PollPacer
from sporenet.federated.server.phases import Participant, TaskInfo, TaskType
from sporenet.federated.server.rounds import BeingAggregatedError, RoundManager
from sporenet.federated.server.state import ModelRecord
from sporenet.federated.server.upload import UploadReceiver, check_upload_id
from sporenet.federated.server.upload_slots import SlotHold, UploadSlots
from sporenet.proto import federated_pb2 as pb

T = TypeVar("T")

SETTLE_SECONDS = 10.0  # longest an upload waits for an earlier stream of the same upload to end
# An update up to this size is checked, validated, written and folded on the loop itself:
# that takes well under a millisecond, less than handing it to a worker thread and back.
# Bigger ones go to the worker threads, so the loop keeps receiving meanwhile.
INLINE_SUBMIT_BYTES = 1 << 20


class ShuttingDown(FederatedError):
    """The server is stopping: the client should reconnect (to it, restarted, or another)."""


class Stream(Protocol):
    """The two directions of a streaming call, as the transport hands them over."""

    async def read(self) -> Any:
        """The next request (raw bytes, a decoded message or a `Refused` one; None at the
        end of the stream)."""
        ...

    async def write(self, message: bytes) -> None:
        """Send one (serialized) reply."""
        ...


def accepted(request: Any) -> Any:
    """`request`, unless the transport refused it (its error is raised)."""
    if isinstance(request, Refused):
        raise request.error
    return request


def require_client(client_id: str) -> str:
    """`client_id`, unless it is empty (UnknownClientError)."""
    if not client_id:
        raise UnknownClientError("client_id is empty; call Register first")
    return client_id


class SessionService:
    """Serves polls, `Session` streams and secure messages on one event loop."""

    def __init__(
        self,
        manager: RoundManager,
        *,
        metrics: Metrics,
        executor: Executor,
        chunk_size: int,
        slots: tuple[int, int],
    ) -> None:
        """`slots`: (download slots, upload receiving slots), see slots.py."""
        self.m, self.metrics = manager, metrics
        self.executor, self.chunk_size = executor, chunk_size
        self._limits = slots
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tasks = EncodedTasks()
        self.model_chunks = ModelChunks(manager.models.read, chunk_size)
        self.pacer = PollPacer(
            heartbeat_timeout=manager.config.heartbeat_timeout,
            clients=lambda: metrics.get("sporenet_clients_registered"),
        )
        self.buffers = BufferPool(slots[1])  # the uploads' receive buffers
        manager.on_change(self._clear_buffers)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the loop that serves the streams (call it on that loop)."""
        self._loop = loop
        self._downloads = asyncio.Semaphore(self._limits[0])
        self._upload_slots = UploadSlots(self._limits[1])  # one per client at most
        self._secure_slots = asyncio.Semaphore(self._limits[0])  # shared with no download
        # The held polls, by client: each waits on a future of its own, resolved when its
        # client's task may have changed (no task per wait, no wake of every poll when
        # only a few clients were given work).
        self._held: dict[str, set[asyncio.Future[None]]] = {}
        # The uploads waiting for a phase's publication, woken by any change of phase.
        self._publications: set[asyncio.Future[None]] = set()
        self._receiving: dict[tuple[str, str], asyncio.Event] = {}
        self._rider_bytes = 0  # the riding data kept by uploads that wait
        # Set at shutdown: sessions waiting for their client's next request end at once
        # (close_idle cancels their pending reads).
        self._closing = False
        self._reads: set[asyncio.Future[Any]] = set()
        self.m.on_change(self._changed_from_any_thread)
        self.m.on_left(self._left_from_any_thread)

    def close_idle(self) -> None:
        """End every session that waits for its client (call it on the loop, at shutdown);
        sessions in the middle of a request finish it within the server's grace period."""
        self._closing = True
        for read in list(self._reads):
            read.cancel()

    async def _next_request(self, stream: Stream) -> bytes | None:
        """The client's next message (None at the end of the stream); ShuttingDown if the
        server closes first. (Cancelling a handler does not end its call: the read itself
        must give way, so it runs as a task of its own that close_idle cancels. Awaited
        directly, not through asyncio.wait: this is every request's path.)"""
        if self._closing:
            raise ShuttingDown("the server is shutting down; reconnect")
        read = asyncio.ensure_future(stream.read())
        self._reads.add(read)
        try:
            raw: bytes | None = accepted(await read)
        except asyncio.CancelledError:
            if self._closing and _read_was_cancelled(read):
                raise ShuttingDown("the server is shutting down; reconnect") from None
            raise
        finally:
            self._reads.discard(read)
        return raw

    def _clear_buffers(self, clients: Collection[str] | None) -> None:
        if clients is None:  # phases change: no buffer kept over a round
            self.buffers.clear()

    def _changed_from_any_thread(self, clients: Collection[str] | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_polls, clients)

    def _wake_polls(self, clients: Collection[str] | None) -> None:
        """Answer again the held polls whose task may have changed: those of `clients`,
        or every one unless no task but WAIT can be given (a round being aggregated)."""
        if clients is not None:
            for cid in clients:
                _resolve(self._held.pop(cid, ()))
            return
        _resolve(self._publications)
        if self._held and self.m.may_give_work():
            held, self._held = self._held, {}
            for futures in held.values():
                _resolve(futures)
        # The phase may have closed or moved on: its uploads give their slots back.
        self._upload_slots.revoke_unwanted(self.m.upload_wanted, "the task's round closed")

    def _left_from_any_thread(self, client_id: str, status: Participant) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            reason = f"client {client_id[:64]!r} is no longer asked for this update ({status})"
            loop.call_soon_threadsafe(self._upload_slots.revoke, client_id, reason)

    async def serve(self, stream: Stream) -> None:
        """A Session: answer the client's requests until it closes the stream."""
        self.metrics.inc("sporenet_sessions_open")
        try:
            await self._serve(stream)
        finally:
            self.metrics.inc("sporenet_sessions_open", -1)

    async def _serve(self, stream: Stream) -> None:
        while (raw := await self._next_request(stream)) is not None:
            field, body = split_session(raw)
            if field == SessionRequestField.POLL:
                await self._poll(body, stream)
            elif field == SessionRequestField.DOWNLOAD:
                await self._download(body, stream)
            elif field == SessionRequestField.UPLOAD:
                await self._upload(body, stream)
            elif field == SessionRequestField.HEARTBEAT:
                beat = _parse(pb.HeartbeatRequest, body)
                self.m.touch(require_client(beat.client_id))
            else:
                raise MalformedMessageError(
                    f"SessionRequest field {field} is not a request this server knows "
                    "(expected poll, download, upload or heartbeat)"
                )

    async def next_task(self, request: pb.TaskRequest) -> TaskInfo:
        """The client's task, waiting up to `wait_ms` (at most `long_poll`) while there is
        nothing to do; a TASK_WAIT answer carries the pacer's pause."""
        cid = require_client(request.client_id)
        loop = asyncio.get_running_loop()
        end = loop.time() + min(max(request.wait_ms / 1000.0, 0.0), self.m.config.long_poll)
        # A held poll is a client that is there: asked again (get_task marks it alive) at
        # least this often, lest a hold longer than heartbeat_timeout make it look silent.
        touch_every = self.m.config.heartbeat_timeout / 3
        while True:
            changed = loop.create_future()  # before the check: a change after it wakes it
            held = self._held.setdefault(cid, set())
            held.add(changed)
            try:
                task = self.m.get_task(cid)
                left = end - loop.time()
                if task.type != TaskType.WAIT or left <= 0 or self.m.stopping:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, touch_every)):  # no task per wait
                        await changed
            finally:
                held.discard(changed)
                if not held and self._held.get(cid) is held:
                    del self._held[cid]
        if task.type == TaskType.WAIT:
            task = dataclasses.replace(task, retry_after=self.pacer.retry_after(task))
        return task

    async def poll(self, request: pb.TaskRequest) -> bytes:
        """The unary Poll: the serialized `Task` (the model is downloaded on a Session)."""
        self.metrics.inc("sporenet_polls_total")
        task = await self.next_task(request)
        model = task.model
        held = model is None or model.sha256 == request.held_model_sha256
        if task.type == TaskType.DONE and held:
            self.m.told_done(request.client_id, model)
        return self.tasks.encode(task)

    async def _poll(self, body: memoryview, stream: Stream) -> None:
        await self._answer_poll(_parse(pb.TaskRequest, body), stream)

    async def _answer_poll(self, request: pb.TaskRequest, stream: Stream) -> None:
        """A Session poll: its task, then the model if asked for and not held."""
        task = await self.next_task(request)
        model = task.model
        held = model is None or model.sha256 == request.held_model_sha256
        done = task.type == TaskType.DONE
        if done and held:
            # Before the write: a client that holds the final model may close the stream
            # as soon as the reply arrives, cancelling this call before it resumes. The
            # daemon's graceful stop still delivers the reply in flight.
            self.m.told_done(request.client_id, model)
        await stream.write(self.tasks.session_reply(task))
        if request.send_model and model is not None and not held:
            await self._send_model(model, 0, self.chunk_size, stream)
            if done:
                self.m.told_done(request.client_id, model)

    async def _download(self, body: memoryview, stream: Stream) -> None:
        request = _parse(pb.DownloadRequest, body)
        cid = require_client(request.client_id)
        self.m.touch(cid)
        record = self.m.model_record(request.model_version)
        if request.offset > record.size:
            raise TransferError(f"offset {request.offset} is past the model's {record.size} bytes")
        chunk = min(request.chunk_size or self.chunk_size, self.chunk_size)
        await self._send_model(record, request.offset, chunk, stream)
        self.m.told_done(cid, record)  # counts only the ended job's final model

    async def _send_model(
        self, record: ModelRecord, offset: int, chunk: int, stream: Stream
    ) -> None:
        """Send the model's bytes from `offset` to the end as `model` replies of `chunk`."""
        async with self._downloads:
            # The cached chunks are encoded from bytes checked against the digest.
            cached = await self._cached_chunks(record, offset, chunk)
            if cached is not None:
                for encoded, size in cached:
                    await stream.write(encoded)
                    self.metrics.inc("sporenet_bytes_sent_total", size)
                return
            # Checked against its digest first (hashed again only if written since).
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self.executor, self.m.models.verify, record)
            path = self.m.model_path(record)
            while offset < record.size:
                data = await asyncio.get_running_loop().run_in_executor(
                    self.executor, _read_at, path, offset, chunk
                )
                if not data:
                    raise TransferError(f"model file ends at byte {offset} of {record.size}")
                await stream.write(encode_model_chunk(offset, data, record.size, session=True))
                offset += len(data)
                self.metrics.inc("sporenet_bytes_sent_total", len(data))

    async def _cached_chunks(
        self, record: ModelRecord, offset: int, chunk: int
    ) -> list[tuple[bytes, int]] | None:
        """The pre-encoded chunks; filling the cache reads and hashes the file, so a
        version not cached yet is read on a worker thread, not on the loop."""
        cached = self.model_chunks.chunks(record, offset, chunk, fill=False)
        if cached is not None or not self.model_chunks.cacheable(record, offset, chunk):
            return cached
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self.model_chunks.chunks, record, offset, chunk
        )

    async def _upload(self, body: memoryview, stream: Stream) -> None:
        header, offset, data = split_first_upload_chunk(body)
        if header is None:
            raise MalformedMessageError(
                "a Session upload starts with an UploadChunk that carries the header; "
                "found no header"
            )
        h = header
        # Data riding with the header (the whole update, from the client's side) saves the
        # upload_offset exchange; it is a view of the request, which dropping it frees.
        rider: tuple[int, memoryview] | None = (offset, data) if len(data) else None
        del data
        cid = require_client(h.client_id)
        check_upload_id(h.upload_id)
        key = (cid, h.upload_id)
        # Checked before the slot too: strangers and clients without an open task are
        # refused at once, never queued for (or holding) a receiving slot. An upload for a
        # phase being aggregated waits for its publication: an async job's next buffer
        # takes it.
        try:
            aggregating = False
            if not self.m.open_upload(cid, h.task_id, h.total_size):
                await self._already_accepted(h, stream)
                return
        except BeingAggregatedError:
            aggregating = True
        # The client's earlier upload, if any, gives its slot up (upload_slots.py).
        hold = self._upload_slots.claim(cid, h.upload_id, h.task_id)
        kept = 0  # bytes of the riding data kept while this upload waits
        try:
            running = self._receiving.get(key)
            if rider is not None and (
                running is not None or aggregating or self._upload_slots.busy
            ):
                # An upload that waits keeps its data while the waiting ones hold no more
                # than the receiving slots may (each up to max_update_bytes): dropped, it
                # is asked for again, and a slot waits a round trip for it meanwhile.
                size = len(rider[1])
                budget = self._limits[1] * self.m.max_update_bytes  # what the slots may hold
                if running is None and self._rider_bytes + size <= budget:
                    kept = size
                    self._rider_bytes += size
                else:
                    rider = None
            if running is not None:  # an earlier stream of this upload keeps what it received
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(running.wait(), SETTLE_SECONDS)
            # Waiting for the publication holds no slot: the slots keep receiving others.
            if aggregating and not await self._open_once_published(hold, h):
                await self._already_accepted(h, stream)
                return
            waited = await self._wait_for_slot(hold)
            _raise_if_revoked(hold)
            # Meanwhile the task may have closed or its update been accepted.
            if (waited or running is not None) and not (await self._open_once_published(hold, h)):
                await self._already_accepted(h, stream)
                return
            done = asyncio.Event()
            self._receiving[key] = done
            try:
                reply = await self._receive(hold, h, stream, rider)
            finally:
                if self._receiving.get(key) is done:
                    del self._receiving[key]
                done.set()
        finally:
            self._rider_bytes -= kept
            self._upload_slots.release(hold)
        await self._reply_upload(h, reply, stream)

    async def _open_once_published(self, hold: SlotHold, h: pb.UploadHeader) -> bool:
        """`open_upload`, once the task's phase is no longer being aggregated."""

        async def check() -> bool:
            return self.m.open_upload(hold.client_id, h.task_id, h.total_size)

        return await self._once_published(hold, check)

    async def _once_published(self, hold: SlotHold, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, called again after each publication while it finds the task's phase
        being aggregated (up to `read_timeout`): once it is published the call decides (a
        round's task is closed then, an async job's carried into the next buffer). The
        client waits on its open stream, and is marked alive meanwhile."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.m.config.read_timeout
        while True:
            published = loop.create_future()  # before the call: a change after it wakes it
            self._publications.add(published)
            try:
                return await call()
            except BeingAggregatedError:
                left = end - loop.time()
                if left <= 0:
                    raise
                _raise_if_revoked(hold)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, self.m.config.heartbeat_interval)):
                        await published
                self.m.touch(hold.client_id)
            finally:
                self._publications.discard(published)

    async def _already_accepted(self, h: pb.UploadHeader, stream: Stream) -> None:
        reply = pb.UploadReply(accepted=True, received=h.total_size, message="already accepted")
        await self._reply_upload(h, reply, stream)

    async def _reply_upload(
        self, h: pb.UploadHeader, reply: pb.UploadReply, stream: Stream
    ) -> None:
        """Answer an upload; then, once its update is in, the poll that rode with it
        (`then_poll_ms`): the client sends no poll message of its own."""
        if reply.accepted:  # acknowledged once durable (group_commit.py)
            await self.m.committed(self.m.config.read_timeout, self.executor)
        poll = reply.accepted and h.HasField("then_poll_ms")
        reply.task_follows = poll
        await stream.write(frame_session(SessionReplyField.UPLOAD_REPLY, reply.SerializeToString()))
        if poll:
            request = pb.TaskRequest(
                client_id=h.client_id, wait_ms=h.then_poll_ms, held_model_sha256=h.held_model_sha256
            )
            await self._answer_poll(request, stream)

    async def _wait_for_slot(self, hold: SlotHold) -> bool:
        """Take a receiving slot for `hold` (none if it is revoked first); whether it
        waited. The client is marked alive while it waits on its open stream."""
        waited = self._upload_slots.busy
        every = max(self.m.config.heartbeat_interval, 0.05)
        touch = functools.partial(self.m.touch, hold.client_id)
        await self._upload_slots.acquire(hold, every=every, waiting=touch)
        return waited

    async def _take_slot(self, slots: asyncio.Semaphore, cid: str) -> bool:
        """Take a slot, waiting if none is free; whether it waited. The client waits on its
        open stream, so it is alive: it is marked so while it waits, lest the round drop
        it as silent."""
        if not slots.locked():  # a free slot: taken without yielding to the loop
            await slots.acquire()
            return False
        every = max(self.m.config.heartbeat_interval, 0.05)
        acquire = asyncio.ensure_future(slots.acquire())
        try:
            while not (await asyncio.wait((acquire,), timeout=every))[0]:
                self.m.touch(cid)
        except BaseException:  # the call ended while waiting: take no slot, or give it back
            if acquire.done() and not acquire.cancelled():
                slots.release()
            acquire.cancel()
            raise
        return True

    async def _receive(
        self,
        hold: SlotHold,
        h: pb.UploadHeader,
        stream: Stream,
        rider: tuple[int, memoryview] | None = None,
    ) -> pb.UploadReply:
        """Take the chunks into one buffer and submit it: the data that rode with the
        header, if it starts where the server's copy ends, else what the client sends
        after being told where to continue.

        The slot is held only while the upload keeps its pace: each read waits at most
        `read_timeout`, and at most until the upload would average less than
        `min_upload_rate` since it got the slot (after a grace of `read_timeout`), so a
        trickle loses the slot as a silence does; and not once the hold is revoked.
        """
        cid = hold.client_id
        upload = UploadReceiver(self.m, self.metrics, cid, h, self.buffers)
        loop = asyncio.get_running_loop()
        try:
            if rider is not None and rider[0] == upload.size:
                upload.add(*rider)
            else:
                offer = pb.UploadOffsetReply(received=upload.size).SerializeToString()
                await stream.write(frame_session(SessionReplyField.UPLOAD_OFFSET, offer))
            rider = None
            limit, rate = self.m.config.read_timeout, self.m.config.min_upload_rate
            start, first = loop.time(), upload.size
            last = start  # when the last chunk came
            while not upload.complete:
                pace = start + limit + (upload.size - first) / rate  # the rate's deadline
                wait = min(limit, max(pace - loop.time(), 0.0))
                raw = await self._read_chunk(hold, stream, wait)
                if raw is _TIMED_OUT:
                    _raise_if_revoked(hold)
                    if loop.time() - last < 0.999 * limit:  # it sends, but too slowly
                        raise ReadTimeoutError(
                            f"upload {h.upload_id[:64]!r} sent {upload.size - first} bytes in "
                            f"{loop.time() - start:.1f} s, below min_upload_rate = {rate:g} "
                            f"bytes/s (at byte {upload.size} of {h.total_size}); its receiving "
                            "slot is given up, resume it on a new stream"
                        )
                    raise ReadTimeoutError(
                        f"upload {h.upload_id[:64]!r} sent nothing for {limit:g} s at byte "
                        f"{upload.size} of {h.total_size} (read_timeout); its receiving slot "
                        "is given up, resume it on a new stream"
                    )
                last = loop.time()
                if raw is None:
                    break
                field, inner = split_session(raw)
                if field != SessionRequestField.UPLOAD:
                    raise MalformedMessageError(
                        f"expected the next upload chunk at byte {upload.size}, found "
                        f"SessionRequest field {field}"
                    )
                upload.add(*split_upload_chunk(inner))
        finally:
            upload.close()
        if not upload.complete:
            return upload.incomplete_reply()

        async def submit() -> pb.UploadReply:
            if h.total_size <= INLINE_SUBMIT_BYTES:
                return upload.submit()
            return await loop.run_in_executor(self.executor, upload.submit)

        return await self._once_published(hold, submit)

    async def _read_chunk(self, hold: SlotHold, stream: Stream, wait: float) -> Any:
        """The next message of an upload within `wait` seconds (`_TIMED_OUT` if none came;
        StaleTaskError or SupersededError once the hold is revoked). The read is a task
        the revocation cancels, awaited under a timeout: no other task per chunk."""
        _raise_if_revoked(hold)
        read = hold.reading = asyncio.ensure_future(stream.read())
        try:
            async with asyncio.timeout(wait):
                return accepted(await read)
        except TimeoutError:
            return _TIMED_OUT
        except asyncio.CancelledError:
            if hold.revoked.is_set() and _read_was_cancelled(read):
                _raise_if_revoked(hold)
            raise
        finally:
            hold.reading = None

    async def submit_secure(self, stream: Stream) -> pb.SecureReply:
        """SubmitSecure: one secure-stage message in chunks. Served on the loop, so every
        read has the `read_timeout` deadline and a stalled peer holds no thread."""
        first = await self._read_secure(stream, 0)
        if first is None or not first.HasField("header"):
            raise UpdateRejectedError("the first SecureChunk of a call must carry the header")
        h = first.header
        cid = require_client(h.client_id)
        stage = STAGE_NAMES.get(h.stage)
        if stage is None:
            raise UpdateRejectedError(f"SecureHeader.stage {h.stage} is not a protocol stage")
        # A masked upload is one ring element per parameter: bound it like an update.
        if h.total_size > self.m.max_update_bytes:
            raise UpdateRejectedError(
                f"secure message of {h.total_size} bytes; at most "
                f"{self.m.max_update_bytes} are accepted (max_update_bytes)"
            )
        self.m.touch(cid)
        await self._take_slot(self._secure_slots, cid)
        try:
            buf = bytearray(first.data)
            while (chunk := await self._read_secure(stream, len(buf))) is not None:
                if len(buf) + len(chunk.data) > h.total_size:
                    raise UpdateRejectedError(
                        f"secure message exceeds the {h.total_size} bytes its header declared"
                    )
                buf += chunk.data
        finally:
            self._secure_slots.release()
        loop = asyncio.get_running_loop()
        if h.withdraw:
            await loop.run_in_executor(self.executor, self.m.withdraw_secure, cid, h.task_id)
            return pb.SecureReply(accepted=True)
        if len(buf) != h.total_size:
            raise TransferError(f"secure message ended at byte {len(buf)} of {h.total_size}")
        self.metrics.inc("sporenet_bytes_received_total", len(buf))
        submit = functools.partial(
            self.m.submit_secure,
            cid,
            h.task_id,
            stage,
            bytes(buf),
            num_samples=h.num_samples,
            metrics_json=h.metrics_json,
        )
        await loop.run_in_executor(self.executor, submit)
        return pb.SecureReply(accepted=True)

    async def _read_secure(self, stream: Stream, at: int) -> Any:
        """The next SecureChunk (None at the end of the stream), within `read_timeout`."""
        limit = self.m.config.read_timeout
        try:
            async with asyncio.timeout(limit):
                raw = await stream.read()
        except TimeoutError:
            raise ReadTimeoutError(
                f"secure message sent nothing for {limit:g} s at byte {at} (read_timeout)"
            ) from None
        return accepted(raw)


_TIMED_OUT = object()  # `_read_chunk`: no message within its wait


def _resolve(futures: Collection[asyncio.Future[None]]) -> None:
    """Wake the polls waiting on `futures`."""
    for future in futures:
        if not future.done():
            future.set_result(None)


def _read_was_cancelled(read: asyncio.Future[Any]) -> bool:
    """Whether the CancelledError just caught came from cancelling `read` itself (at
    shutdown, or by a revocation), not from cancelling the handler that awaits it."""
    task = asyncio.current_task()
    return read.cancelled() and not (task and task.cancelling())


def _raise_if_revoked(hold: SlotHold) -> None:
    """End an upload whose hold was revoked, saying why."""
    if not hold.revoked.is_set():
        return
    if hold.reason.startswith("superseded"):
        raise SupersededError(f"upload {hold.upload_id[:64]!r} {hold.reason}")
    raise StaleTaskError(
        f"upload {hold.upload_id[:64]!r} gave up its receiving slot: {hold.reason}"
    )


def _parse(message_type: Any, body: memoryview) -> Any:
    try:
        return message_type.FromString(bytes(body))
    except Exception as e:  # protobuf's DecodeError
        raise MalformedMessageError(
            f"SessionRequest holds a malformed {message_type.DESCRIPTOR.name}: {e}"
        ) from None


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)
