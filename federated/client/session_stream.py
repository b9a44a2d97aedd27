"""The client's end of a Session stream, served by one asyncio loop per process.

A Session (see federated.proto) carries a client's polls, downloads, uploads and
heartbeats over one long-lived stream. Through gRPC's blocking API every stream costs
threads (one feeding its requests, one watching for overdue replies, since a blocking
read has no timeout) and every message a hand-off between them; with a fleet simulated
in one process those hand-offs were most of the clients' CPU. Here the sessions of all
clients of a process are coroutines on one `TransportLoop` thread: a client's thread
hands it a whole exchange (a poll and the model that follows it, an upload) and waits
once, and a reply's timeout is an `asyncio.timeout`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, NoReturn, TypeVar

import grpc

from sporenet.federated.common.wire import SessionReplyField, frame_session, identity, split_session
from sporenet.federated.errors import MalformedMessageError, TransferError

T = TypeVar("T")


def _name(field: int) -> str:
    """A SessionReply oneof field for messages: its name and number."""
    try:
        return f"{SessionReplyField(field).name.lower()} ({field})"
    except ValueError:
        return f"field {field}"


class TransportLoop:
    """A daemon thread running the event loop that carries this process's sessions."""

    _shared: ClassVar[TransportLoop | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="session-loop", daemon=True
        )
        self._thread.start()

    @classmethod
    def shared(cls) -> TransportLoop:
        """The process's loop, started on first use (and again in a forked child, which
        has the parent's object but not its thread)."""
        with cls._lock:
            if cls._shared is None or cls._shared.pid != os.getpid():
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for it; its exception is raised here."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start `coro` on the loop without waiting (cancel the future to stop it)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Any, *args: Any) -> None:
        """Call `fn(*args)` on the loop, soon (for grpc.aio objects, which are not
        thread-safe)."""
        self.loop.call_soon_threadsafe(fn, *args)


class SessionStream:
    """One open Session call. Use it only from coroutines on its TransportLoop."""

    def __init__(
        self, channel: grpc.aio.Channel, method: str, metadata: Sequence[tuple[str, str]] = ()
    ) -> None:
        open_call = channel.stream_stream(
            method, request_serializer=identity, response_deserializer=identity
        )
        self._call = open_call(metadata=tuple(metadata))
        self._writing = asyncio.Lock()  # heartbeats may write while an exchange does
        self.closed = False

    async def send(self, field: int, message: bytes) -> None:
        """Send the SessionRequest whose oneof `field` holds the encoded `message`."""
        await self.send_framed(frame_session(field, message))

    async def send_framed(self, request: bytes) -> None:
        """Send an already framed SessionRequest; raises like `receive` when the call
        has ended."""
        if self._call.done():
            await self._raise_ended()
        async with self._writing:
            try:
                await self._call.write(request)
            except grpc.RpcError:
                self.closed = True
                raise
            except asyncio.InvalidStateError:  # the call ended meanwhile
                await self._raise_ended()

    async def receive(self, expected: Sequence[int], timeout: float) -> tuple[int, memoryview]:
        """The next reply, (oneof field, encoded message), which must be one of `expected`.

        Raises grpc.RpcError when the stream failed (with the server's status),
        TransferError when no reply came within `timeout` seconds or the server ended the
        stream, MalformedMessageError for a reply that is not one of `expected`.
        """
        try:
            async with asyncio.timeout(timeout):  # no task per read, unlike wait_for
                raw = await self._call.read()
        except TimeoutError:
            self.close()
            raise TransferError(f"no reply from the server within {timeout:g} s") from None
        except grpc.RpcError:
            self.closed = True
            raise
        if raw is grpc.aio.EOF:
            await self._raise_ended()
        field, body = split_session(raw)
        if field not in expected:
            self.close()
            raise MalformedMessageError(
                f"expected a SessionReply {' or '.join(_name(f) for f in expected)}, "
                f"got {_name(field)}"
            )
        return field, body

    async def _raise_ended(self) -> NoReturn:
        """Raise how the call ended: its status, or TransferError if it ended cleanly."""
        self.closed = True
        code = await self._call.code()
        if code == grpc.StatusCode.OK:
            raise TransferError("the server ended the session")
        raise grpc.aio.AioRpcError(
            code,
            await self._call.initial_metadata(),
            await self._call.trailing_metadata(),
            await self._call.details(),
        )

    def close(self) -> None:
        self.closed = True
        self._call.cancel()
