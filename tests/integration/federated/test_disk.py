"""Disk: partial uploads (`.part`) are removed at start, once the client's update is in,
and when the phase closes; SIGTERM on a full disk still stops gracefully."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import grpc

from sporenet.federated.common.codec import encode_update
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc
from tests.integration.federated.helpers import (
    RawSession,
    fit_task,
    make_model,
    upload_raw,
    wait_for,
)


def test_partial_uploads_are_removed(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=64, inp=64)
    server = server_factory(["--model", str(tmp_path / "init.spore"), "--min-clients", "1"])
    server.args += ["--rounds", "1"]
    uploads = server.state_dir / "uploads"
    uploads.mkdir(parents=True)
    (uploads / "left-over-from-a-crash.part").write_bytes(b"x" * 1000)
    server.start()
    assert not list(uploads.glob("*.part"))  # removed at start

    channel = grpc.insecure_channel(server.address)
    cid = pb_grpc.FederatedStub(channel).Register(pb.RegisterRequest(client_name="p")).client_id
    task = fit_task(channel, cid)
    payload = encode_update({k: v + 1.0 for k, v in w0.items()})
    header = pb.UploadHeader(
        client_id=cid, task_id=task.task_id, upload_id="a", total_size=len(payload), num_samples=3
    )
    session = RawSession(channel)
    session.upload_header(header)
    session.upload_data(payload, 0, len(payload) // 2, 4096)
    wait_for(session.all_sent, what="the first half sent")
    session.close()  # the stream breaks: the server keeps what arrived for a resumption
    wait_for(lambda: list(uploads.glob("*.part")), timeout=30, what="the .part file")

    reply = upload_raw(channel, client_id=cid, task_id=task.task_id, payload=payload, upload_id="b")
    assert reply.accepted
    wait_for(lambda: server.events("job_finished"), timeout=60, what="the job to finish")
    assert not list(uploads.glob("*.part")), list(uploads.iterdir())
    channel.close()
    assert server.terminate() == 0


def _limit_file_size() -> None:
    # Writes past 320 KiB fail with EFBIG, as on a full disk (SIGXFSZ would kill instead).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (320 << 10, 320 << 10))


def test_sigterm_on_a_full_disk_stops_gracefully(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    # 205 KB of float32 weights fit under the limit; the aggregate checkpoint SIGTERM
    # writes (float64 sums, 410 KB) does not.
    make_model(tmp_path / "init.spore", out=128, inp=400)
    server = server_factory(["--model", str(tmp_path / "init.spore"), "--min-clients", "1"])
    server.start(preexec_fn=_limit_file_size)
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.FederatedStub(channel)
        cid = stub.Register(pb.RegisterRequest(client_name="c")).client_id
        fit_task(channel, cid)  # the fit phase is open: stopping checkpoints its aggregate
    assert server.terminate(timeout=30) == 0, server.logs()
    failed = server.events("stop_persist_failed")
    assert failed and "too large" in failed[0]["error"], server.logs()
    assert server.events("server_stopped"), server.logs()
