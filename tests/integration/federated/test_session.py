"""The Session stream driven by hand (raw gRPC, protobuf messages) against the real daemon."""

from __future__ import annotations

import hashlib
import threading
import time
import zlib
from pathlib import Path

import grpc
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sporenet.federated.common.auth import Credentials
from sporenet.federated.common.codec import encode_update
from sporenet.federated.common.wire import SessionRequestField, frame_session
from sporenet.federated.server.status import read_status
from sporenet.lite import read_weights
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import (
    SESSION,
    RawSession,
    auth_config,
    make_model,
    status_command,
    wait_for,
)

REGISTER = "/sporenet.federated.v1.Federated/Register"


def _register(channel: grpc.Channel, name: str, metadata: list | None = None) -> str:
    stub = pb_grpc.FederatedStub(channel)
    return stub.Register(
        pb.RegisterRequest(client_name=name), metadata=metadata, timeout=10
    ).client_id


def _fit_task(session: RawSession, client_id: str) -> pb.Task:
    for _ in range(20):
        task = session.poll(client_id, wait_ms=2000)
        if task.type == pb.TASK_FIT:
            return task
    raise AssertionError("no fit task")


def _header(client_id: str, task: pb.Task, payload: bytes, upload_id: str) -> pb.UploadHeader:
    return pb.UploadHeader(
        client_id=client_id,
        task_id=task.task_id,
        upload_id=upload_id,
        total_size=len(payload),
        crc32=zlib.crc32(payload),
        num_samples=4,
    )


def _server(tmp_path: Path, server_factory, *args: str, **model: int):  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", **model)
    server = server_factory(["--model", str(tmp_path / "init.spore"), *args]).start()
    return w0, server


def test_a_whole_round_over_one_session(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0, server = _server(
        tmp_path, server_factory, "--rounds", "1", "--min-clients", "1", out=40, inp=50
    )
    with grpc.insecure_channel(server.address) as channel:
        cid = _register(channel, "hand")
        session = RawSession(channel)
        task = _fit_task(session, cid)
        assert task.round == 1 and task.model_size > 8000

        # Small chunks: the model comes in order, in pieces of at most 1 KiB.
        chunks = session.download(
            pb.DownloadRequest(client_id=cid, model_version=task.model_version, chunk_size=1024)
        )
        assert len(chunks) == -(-task.model_size // 1024)
        assert [c.offset for c in chunks] == list(range(0, task.model_size, 1024))
        assert {c.total_size for c in chunks} == {task.model_size}
        model = b"".join(c.data for c in chunks)
        assert len(model) == task.model_size
        assert hashlib.sha256(model).hexdigest() == task.model_sha256
        assert task.HasField("model_crc32") and task.model_crc32 == zlib.crc32(model)
        # The server's chunk size (the pre-encoded chunks), and a download from an offset.
        whole = session.download(
            pb.DownloadRequest(client_id=cid, model_version=task.model_version)
        )
        assert b"".join(c.data for c in whole) == model
        tail = session.download(
            pb.DownloadRequest(client_id=cid, model_version=task.model_version, offset=5000)
        )
        assert tail[0].offset == 5000 and b"".join(c.data for c in tail) == model[5000:]
        np.testing.assert_array_equal(read_weights(model)["w"], w0["w"])

        payload = encode_update({k: np.full_like(v, 0.5) for k, v in w0.items()})
        # A heartbeat is not answered: the next reply is the upload's offset.
        beat = pb.HeartbeatRequest(client_id=cid, task_id=task.task_id)
        session.send(pb.SessionRequest(heartbeat=beat))
        offer = session.upload_header(_header(cid, task, payload, "up1"))
        assert offer.WhichOneof("kind") == "upload_offset" and offer.upload_offset.received == 0
        session.upload_data(payload, 0, len(payload), 1000)
        reply = session.receive("upload_reply").upload_reply
        assert (reply.accepted, reply.received) == (True, len(payload))

        done = session.poll(cid, wait_ms=5000)
        assert done.type == pb.TASK_DONE and done.model_version == task.model_version + 1
        final = session.download(
            pb.DownloadRequest(client_id=cid, model_version=done.model_version)
        )
        final_weights = read_weights(b"".join(c.data for c in final))
        for k, v in w0.items():
            np.testing.assert_allclose(final_weights[k], v + 0.5, rtol=1e-6)
        session.close()

    status = status_command(server.state_dir)
    assert status["job"]["status"] == "finished"
    assert status["rounds"][0]["num_results"] == 1


def test_an_update_rides_with_its_header(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    # The header's chunk carries the whole update: the server, with a slot free, takes it
    # and answers upload_reply alone (no upload_offset exchange); the update counts once.
    w0, server = _server(tmp_path, server_factory, "--rounds", "1", "--min-clients", "2")
    with grpc.insecure_channel(server.address) as channel:
        a, b = _register(channel, "rider"), _register(channel, "walker")
        session = RawSession(channel)
        task = _fit_task(session, a)
        task_b = _fit_task(RawSession(channel), b)
        payload = encode_update({k: np.full_like(v, 0.5) for k, v in w0.items()})
        header = _header(a, task, payload, "ride1")
        session.send(pb.SessionRequest(upload=pb.UploadChunk(header=header, data=payload)))
        reply = session.receive("upload_reply").upload_reply
        assert (reply.accepted, reply.received) == (True, len(payload))
        # Sent again (a client that missed the reply): already accepted, not folded twice.
        session.send(pb.SessionRequest(upload=pb.UploadChunk(header=header, data=payload)))
        again = session.receive("upload_reply").upload_reply
        assert again.accepted and again.message == "already accepted"
        # A header-only upload still gets its offset first.
        other = RawSession(channel)
        assert other.upload_header(_header(b, task_b, payload, "walk1")).upload_offset.received == 0
        other.upload_data(payload, 0, len(payload), 1000)
        assert other.receive("upload_reply").upload_reply.accepted
        other.close()
        done = session.poll(a, wait_ms=5000)
        assert done.type == pb.TASK_DONE
        final = session.download(pb.DownloadRequest(client_id=a, model_version=done.model_version))
        session.close()
    final_weights = read_weights(b"".join(c.data for c in final))
    for k, v in w0.items():
        np.testing.assert_allclose(final_weights[k], v + 0.5, rtol=1e-6)
    assert status_command(server.state_dir)["rounds"][0]["num_results"] == 2


def test_a_poll_rides_with_an_upload(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    # A header with then_poll_ms: the accepted update's reply says a task follows, and the
    # poll is answered next, held like a poll until there is work (here, the next round),
    # with no poll message from the client. Without it, no task follows the reply.
    w0, server = _server(tmp_path, server_factory, "--rounds", "2", "--min-clients", "2")
    with grpc.insecure_channel(server.address) as channel:
        a, b = _register(channel, "rider"), _register(channel, "walker")
        session, other = RawSession(channel), RawSession(channel)
        task, task_b = _fit_task(session, a), _fit_task(other, b)
        payload = encode_update({k: np.full_like(v, 0.5) for k, v in w0.items()})
        header = _header(a, task, payload, "ride1")
        header.then_poll_ms, header.held_model_sha256 = 20000, task.model_sha256
        session.send(pb.SessionRequest(upload=pb.UploadChunk(header=header, data=payload)))
        reply = session.receive("upload_reply").upload_reply
        assert (reply.accepted, reply.task_follows) == (True, True)
        plain = _header(b, task_b, payload, "walk1")
        other.send(pb.SessionRequest(upload=pb.UploadChunk(header=plain, data=payload)))
        reply_b = other.receive("upload_reply").upload_reply
        assert (reply_b.accepted, reply_b.task_follows) == (True, False)
        # b's upload closes round 1; the poll that rode with a's is answered with round 2.
        nxt = session.receive("task").task
        assert nxt.type == pb.TASK_FIT and nxt.round == 2
        assert nxt.model_version == task.model_version + 1
        session.close()
        other.close()
    assert status_command(server.state_dir)["rounds"][0]["num_results"] == 2


def test_bad_updates_end_the_session_and_are_not_counted(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0, server = _server(tmp_path, server_factory, "--rounds", "1", "--min-clients", "2")
    with grpc.insecure_channel(server.address) as channel:
        a, b = _register(channel, "a"), _register(channel, "b")
        task = _fit_task(RawSession(channel), a)
        _fit_task(RawSession(channel), b)
        good = encode_update({k: np.ones_like(v) for k, v in w0.items()})
        bad = {
            "shape": encode_update({"w": np.ones((4, 3), np.float32), "b": np.ones(3, np.float32)}),
            "nan": encode_update({"w": np.full((3, 4), np.nan, np.float32), "b": w0["b"]}),
        }
        found = {
            "shape": "expected float32[3, 4], got float32[4, 3]",
            "nan": "NaN or infinite",
        }
        for name, payload in bad.items():
            session = RawSession(channel)
            offer = session.upload_header(_header(a, task, payload, f"bad-{name}"))
            assert offer.upload_offset.received == 0
            session.upload_data(payload, 0, len(payload), 64)
            code, details = session.refusal()
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert found[name] in details, details
            assert read_status(server.state_dir)["participants"] == {a: "selected", b: "selected"}

        # Two refusals leave the client in the round: a good update on a new session counts.
        session = RawSession(channel)
        assert session.upload_header(_header(a, task, good, "good")).upload_offset.received == 0
        session.upload_data(good, 0, len(good), 64)
        assert session.receive("upload_reply").upload_reply.accepted
        assert read_status(server.state_dir)["participants"] == {a: "accepted", b: "selected"}
        # Its header again: answered at once, nothing more to send.
        again = session.upload_header(_header(a, task, good, "good")).upload_reply
        assert (again.accepted, again.received, again.message) == (
            True,
            len(good),
            "already accepted",
        )
        session.close()

        session = RawSession(channel)
        session.upload_header(_header(b, task, good, "good"))
        session.upload_data(good, 0, len(good), 1 << 20)
        assert session.receive("upload_reply").upload_reply.accepted
        assert session.poll(b, wait_ms=5000).type == pb.TASK_DONE
        session.close()
    status = status_command(server.state_dir)
    assert status["job"]["status"] == "finished"
    assert status["rounds"][0]["num_results"] == 2


def test_an_update_that_does_not_match_its_checksum_is_refused(  # type: ignore[no-untyped-def]
    tmp_path: Path, server_factory
) -> None:
    w0, server = _server(tmp_path, server_factory, "--rounds", "1", "--min-clients", "1")
    with grpc.insecure_channel(server.address) as channel:
        cid = _register(channel, "a")
        task = _fit_task(RawSession(channel), cid)
        good = encode_update({k: np.ones_like(v) for k, v in w0.items()})
        # A header that describes other bytes: one flipped bit.
        flipped = bytes([good[0] ^ 1]) + good[1:]
        session = RawSession(channel)
        assert session.upload_header(_header(cid, task, flipped, "crc")).upload_offset.received == 0
        session.upload_data(good, 0, len(good), 1 << 20)
        code, details = session.refusal()
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert f"CRC-32 {zlib.crc32(good):08x}; the upload header declared" in details, details
        assert read_status(server.state_dir)["participants"] == {cid: "selected"}

        # The matching CRC-32: accepted, and the round publishes it.
        header = _header(cid, task, good, "good")
        session = RawSession(channel)
        session.upload_header(header)
        session.upload_data(good, 0, len(good), 1 << 20)
        assert session.receive("upload_reply").upload_reply.accepted
        assert session.poll(cid, wait_ms=5000).type == pb.TASK_DONE
        session.close()
    assert status_command(server.state_dir)["rounds"][0]["num_results"] == 1


def test_malformed_and_refused_requests_end_the_session_with_their_status(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    _, server = _server(tmp_path, server_factory, "--rounds", "1", "--min-clients", "1")
    with grpc.insecure_channel(server.address) as channel:
        cid = _register(channel, "m")
        task = _fit_task(RawSession(channel), cid)
        header = pb.UploadHeader(client_id=cid, task_id=task.task_id, upload_id="u", total_size=100)

        def refusal(*requests: pb.SessionRequest | bytes) -> tuple[grpc.StatusCode, str]:
            session = RawSession(channel)
            for request in requests:
                session.send(request)
            return session.refusal()

        invalid = grpc.StatusCode.INVALID_ARGUMENT
        # No oneof set: an empty message.
        code, details = refusal(pb.SessionRequest())
        assert code == invalid and "empty Session message" in details, details
        # A field this server does not know (number 5, length-delimited), kept by protobuf.
        unknown = pb.SessionRequest.FromString(frame_session(5, b""))
        code, details = refusal(unknown)
        assert (code, details) == (
            invalid,
            "SessionRequest field 5 is not a request this server knows "
            "(expected poll, download, upload or heartbeat)",
        )
        # A poll whose TaskRequest is not protobuf.
        code, details = refusal(frame_session(SessionRequestField.POLL, b"\xff"))
        assert code == invalid and "malformed TaskRequest" in details, details
        # An upload must open with the header.
        code, details = refusal(pb.SessionRequest(upload=pb.UploadChunk(offset=0, data=b"x")))
        assert code == invalid and details.endswith("found no header"), details
        # ...then sends data chunks, not another request.
        session = RawSession(channel)
        assert session.upload_header(header).upload_offset.received == 0
        session.send(pb.SessionRequest(poll=pb.TaskRequest(client_id=cid)))
        code, details = session.refusal()
        assert code == invalid, details
        assert "expected the next upload chunk at byte 0, found SessionRequest field 1" in details
        # Data that does not continue where the server is.
        session = RawSession(channel)
        assert session.upload_header(header).upload_offset.received == 0
        session.send(pb.SessionRequest(upload=pb.UploadChunk(offset=5, data=b"x")))
        code, details = session.refusal()
        assert code == grpc.StatusCode.OUT_OF_RANGE, details
        assert "chunk at offset 5 does not follow byte 0" in details
        # No client id; a task that is not open.
        code, details = refusal(pb.SessionRequest(poll=pb.TaskRequest(client_id="")))
        assert code == grpc.StatusCode.NOT_FOUND and "call Register first" in details, details
        stale = pb.UploadHeader(
            client_id=cid, task_id="no-such-round", upload_id="u", total_size=100
        )
        code, details = refusal(pb.SessionRequest(upload=pb.UploadChunk(header=stale)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert "'no-such-round' is not open" in details

        # None of it cost the client its task.
        assert RawSession(channel).poll(cid).type == pb.TASK_FIT
    assert read_status(server.state_dir)["participants"] == {cid: "selected"}


def test_sessions_authenticate_when_they_open(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    key = Ed25519PrivateKey.generate()
    config = auth_config(tmp_path, key, {"alice": "tok-alice"}, min_clients=1)
    server = server_factory(["--config", str(config)]).start()
    alice = [("authorization", "Bearer tok-alice")]
    with grpc.insecure_channel(server.address) as channel:
        assert _register(channel, "x", alice) == "alice"
        # Refused before any request is sent.
        code, details = RawSession(channel).refusal()
        assert code == grpc.StatusCode.UNAUTHENTICATED and "no credentials" in details, details
        bad_token = RawSession(channel, [("authorization", "Bearer nope")])
        bad_token.send(pb.SessionRequest(poll=pb.TaskRequest(client_id="alice")))
        code, details = bad_token.refusal()
        assert code == grpc.StatusCode.UNAUTHENTICATED and "unknown token" in details, details
        # Signed for another method: the signature covers the method path.
        signed_for_register = Credentials(key_id="dev1", private_key=key).metadata(
            REGISTER, audience=server.address
        )
        code, details = RawSession(channel, signed_for_register).refusal()
        assert code == grpc.StatusCode.UNAUTHENTICATED and "bad signature" in details, details

        session = RawSession(channel, alice)
        assert session.poll("alice", wait_ms=5000).type == pb.TASK_FIT
        session.send(pb.SessionRequest(poll=pb.TaskRequest(client_id="dev1")))
        code, details = session.refusal()
        assert code == grpc.StatusCode.PERMISSION_DENIED and "'alice'" in details, details

        dev1 = Credentials(key_id="dev1", private_key=key)
        assert _register(channel, "y", dev1.metadata(REGISTER, audience=server.address)) == "dev1"
        signed = dev1.metadata(SESSION, audience=server.address)
        session = RawSession(channel, signed)
        assert session.poll("dev1").type in (pb.TASK_WAIT, pb.TASK_FIT)
        session.close()


def test_an_interrupted_upload_resumes_on_a_new_session(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0, server = _server(
        tmp_path, server_factory, "--rounds", "1", "--min-clients", "1", out=100, inp=100
    )
    chunk, sent = 4096, 4 * 4096
    with grpc.insecure_channel(server.address) as channel:
        cid = _register(channel, "r")
        task = _fit_task(RawSession(channel), cid)
        payload = encode_update({k: np.full_like(v, 0.25) for k, v in w0.items()})
        assert len(payload) > 2 * sent
        header = _header(cid, task, payload, "resume1")

        # A session sends some chunks and its connection drops. The server keeps what came,
        # in whole chunks (it writes them when the stream breaks); the drop may still
        # overtake chunks in flight, so the client tries again until something was kept.
        kept = 0
        for _ in range(50):
            first = RawSession(channel)
            assert first.upload_header(header).upload_offset.received == kept
            first.upload_data(payload, kept, kept + sent, chunk)
            wait_for(first.all_sent, what="gRPC to take the chunks")
            first.call.cancel()
            second = RawSession(channel)
            kept = second.upload_header(header).upload_offset.received
            if kept:
                break
            second.close()
        assert 0 < kept < len(payload) and kept % chunk == 0, kept
        # The whole update riding with the header is dropped: the server holds part of
        # this upload, so it says where to continue, as for a header-only chunk.
        rider = pb.UploadChunk(header=header, offset=0, data=payload)
        second.close()
        second = RawSession(channel)
        second.send(pb.SessionRequest(upload=rider))
        assert second.receive("upload_offset").upload_offset.received == kept
        # Starting over from 0 is refused with the offset to use; nothing is lost.
        second.send(pb.SessionRequest(upload=pb.UploadChunk(offset=0, data=payload[:chunk])))
        code, details = second.refusal()
        assert code == grpc.StatusCode.OUT_OF_RANGE, details
        assert f"chunk at offset 0 does not follow byte {kept}" in details

        third = RawSession(channel)
        assert third.upload_header(header).upload_offset.received == kept
        third.upload_data(payload, kept, len(payload), chunk)
        reply = third.receive("upload_reply").upload_reply
        assert (reply.accepted, reply.received) == (True, len(payload))
        done = third.poll(cid, wait_ms=5000)
        assert done.type == pb.TASK_DONE
        final = third.download(pb.DownloadRequest(client_id=cid, model_version=done.model_version))
        third.close()
    final_weights = read_weights(b"".join(c.data for c in final))
    for k, v in w0.items():
        np.testing.assert_allclose(final_weights[k], v + 0.25, rtol=1e-6)
    assert read_status(server.state_dir)["rounds"][0]["num_results"] == 1


def test_a_poll_is_held_until_there_is_work_or_wait_ms_passes(
    tmp_path: Path, server_factory
) -> None:  # type: ignore[no-untyped-def]
    _, server = _server(tmp_path, server_factory, "--rounds", "1", "--min-clients", "2")
    with grpc.insecure_channel(server.address) as channel:
        a = _register(channel, "a")
        session = RawSession(channel)
        start = time.monotonic()
        task = session.poll(a, wait_ms=1500)
        held = time.monotonic() - start
        assert task.type == pb.TASK_WAIT and task.retry_after_ms > 0, task
        assert 1.4 <= held < 5.0, held

        # A second client makes the round start: the held poll answers long before wait_ms.
        threading.Timer(0.5, _register, (channel, "b")).start()
        start = time.monotonic()
        task = session.poll(a, wait_ms=20_000)
        held = time.monotonic() - start
        assert task.type == pb.TASK_FIT, task
        assert 0.4 <= held < 5.0, held
        session.close()


def test_a_poll_can_ask_for_the_model_to_follow_the_task(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0, server = _server(
        tmp_path, server_factory, "--rounds", "1", "--min-clients", "1", out=600, inp=1000
    )  # 2.4 MB: several of the server's chunks
    with grpc.insecure_channel(server.address) as channel:
        cid = _register(channel, "inline")
        session = RawSession(channel)
        ask = pb.TaskRequest(client_id=cid, wait_ms=5000, send_model=True)
        session.send(pb.SessionRequest(poll=ask))
        task = session.receive("task").task
        assert task.type == pb.TASK_FIT
        # The chunks come right after the task, with no download request: the whole model.
        chunks = [session.receive("model").model]
        while chunks[-1].offset + len(chunks[-1].data) < task.model_size:
            chunks.append(session.receive("model").model)
        assert len(chunks) > 1 and chunks[0].offset == 0
        model = b"".join(c.data for c in chunks)
        assert hashlib.sha256(model).hexdigest() == task.model_sha256
        got = read_weights(model)
        for k, v in w0.items():
            np.testing.assert_array_equal(got[k], v)

        # Holding that model (its sha256), the client gets the task alone: the next reply
        # is the answer to the next request, a task again.
        held = pb.TaskRequest(client_id=cid, send_model=True, held_model_sha256=task.model_sha256)
        session.send(pb.SessionRequest(poll=held))
        assert session.receive("task").task.model_sha256 == task.model_sha256
        session.send(pb.SessionRequest(poll=pb.TaskRequest(client_id=cid)))
        assert session.receive("task").task.task_id == task.task_id
        session.close()
