"""The client's SessionStream on the shared TransportLoop, against a real gRPC server on
loopback whose Session handler misbehaves on request: replies late, aborts, ends the
stream, or answers with the wrong field."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from sporenet.federated.client.session_stream import SessionStream, TransportLoop
from sporenet.federated.common.wire import (
    SessionReplyField,
    SessionRequestField,
    frame_session,
    identity,
    split_session,
)
from sporenet.federated.errors import MalformedMessageError, TransferError

METHOD = "/sporenet.test.Sessions/Session"


def _handler(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    """Per request (its body names the behaviour): echo it as a TASK reply, stay silent,
    abort, end the stream, or reply with a MODEL field."""
    for raw in requests:
        _, body = split_session(raw)
        mode = bytes(body)
        if mode == b"silent":
            time.sleep(2.0)
        elif mode == b"abort":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the round is closed")
        elif mode == b"end":
            return
        elif mode == b"model":
            yield frame_session(SessionReplyField.MODEL, b"x")
        else:
            yield frame_session(SessionReplyField.TASK, mode)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler(
        "sporenet.test.Sessions",
        {"Session": grpc.stream_stream_rpc_method_handler(_handler, identity, identity)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def _exchange(address: str, mode: bytes, timeout: float = 5.0) -> tuple[int, bytes, bool]:
    """Open a session, send one poll carrying `mode`, return (field, body, closed)."""

    async def run() -> tuple[int, bytes, bool]:
        channel = grpc.aio.insecure_channel(address)
        try:
            session = SessionStream(channel, METHOD, [])
            try:
                await session.send(SessionRequestField.POLL, mode)
                field, body = await session.receive((SessionReplyField.TASK,), timeout)
                return field, bytes(body), session.closed
            finally:
                session.close()
        finally:
            await channel.close()

    return TransportLoop.shared().run(run())


def test_a_reply_comes_back_through_the_shared_loop(address: str) -> None:
    assert _exchange(address, b"hello") == (SessionReplyField.TASK, b"hello", False)


def test_an_overdue_reply_is_a_transfer_error(address: str) -> None:
    started = time.monotonic()
    with pytest.raises(TransferError, match=r"no reply from the server within 0.3 s"):
        _exchange(address, b"silent", timeout=0.3)
    assert time.monotonic() - started < 1.5  # not the server's 2 s


def test_the_servers_status_is_raised(address: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        _exchange(address, b"abort")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == "the round is closed"


def test_a_stream_the_server_ended_is_a_transfer_error(address: str) -> None:
    with pytest.raises(TransferError, match="the server ended the session"):
        _exchange(address, b"end")


def test_an_unexpected_reply_field_is_refused(address: str) -> None:
    expected = r"expected a SessionReply task \(1\), got model \(2\)"
    with pytest.raises(MalformedMessageError, match=expected):
        _exchange(address, b"model")


def test_one_loop_per_process_serves_clients_of_many_threads(address: str) -> None:
    loops, results = set(), {}

    def client(i: int) -> None:
        loops.add(TransportLoop.shared())
        results[i] = _exchange(address, f"c{i}".encode())[1]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(loops) == 1
    assert results == {i: f"c{i}".encode() for i in range(8)}
