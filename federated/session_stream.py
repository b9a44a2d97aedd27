"""The client's end of a Session stream: requests in through a queue, replies read in order.

A Session (see federated.proto) carries a client's polls, downloads, uploads and
heartbeats over one long-lived stream. gRPC's blocking API has no timeout for reading the
next message of a stream, so a watchdog cancels the call when a reply is overdue; the
client then opens a new session, as it would after any failure.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence

import grpc

from sporenet.federated.errors import MalformedMessageError, TransferError
from sporenet.federated.wire import frame_session, identity, split_session


class Watchdog:
    """Cancels a call whose reply is not in by its deadline (one thread per client)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._call: grpc.Future | None = None
        self._due = 0.0
        self._thread: threading.Thread | None = None

    def arm(self, call: grpc.Future, seconds: float) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="session-watchdog",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._call, self._due = call, time.monotonic() + seconds
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._call = None  # no wake-up needed: the thread finds nothing to do at `due`

    def close(self) -> None:
        """Stop the thread (a later `arm` starts a new one)."""
        with self._cond:
            thread, self._thread, self._call = self._thread, None, None
            self._cond.notify()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        me = threading.current_thread()
        with self._cond:
            while self._thread is me:
                if self._call is None:
                    self._cond.wait()
                    continue
                left = self._due - time.monotonic()
                if left <= 0:
                    self._call.cancel()
                    self._call = None
                else:
                    self._cond.wait(left)


class SessionStream:
    """One open Session call. Thread-safe for `send`; `receive` is for one thread."""

    def __init__(
        self, channel: grpc.Channel, method: str, metadata: Sequence[tuple[str, str]],
        watchdog: Watchdog,
    ) -> None:  # fmt: skip
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._watchdog = watchdog
        open_call = channel.stream_stream(
            method, request_serializer=identity, response_deserializer=identity
        )
        self._call = open_call(self._outgoing(), metadata=metadata)
        self.closed = False

    def _outgoing(self) -> Iterator[bytes]:
        while True:
            message = self._requests.get()
            if message is None:
                return
            yield message

    def send(self, field: int, message: bytes) -> None:
        """Queue the SessionRequest whose oneof `field` holds the encoded `message`."""
        self._requests.put(frame_session(field, message))

    def send_framed(self, request: bytes) -> None:
        """Queue an already framed SessionRequest."""
        self._requests.put(request)

    def receive(self, expected: Sequence[int], timeout: float) -> tuple[int, memoryview]:
        """The next reply, (oneof field, encoded message), which must be one of `expected`.

        Raises grpc.RpcError when the stream failed (the server's status, or CANCELLED when
        no reply came within `timeout` seconds), TransferError when the server ended it,
        MalformedMessageError for a reply that is not one of `expected`.
        """
        self._watchdog.arm(self._call, timeout)
        try:
            raw = next(self._call)
        except grpc.RpcError:
            self.closed = True
            raise
        except StopIteration:
            self.closed = True
            raise TransferError("the server ended the session") from None
        finally:
            self._watchdog.disarm()
        field, body = split_session(raw)
        if field not in expected:
            self.close()
            raise MalformedMessageError(
                f"expected a SessionReply with field {list(expected)}, got field {field}"
            )
        return field, body

    def close(self) -> None:
        self.closed = True
        self._requests.put(None)
        self._call.cancel()
