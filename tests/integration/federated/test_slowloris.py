"""Stalled uploads cannot pin the receiving slots: a peer that sends an upload header and
then nothing loses its slot after `read_timeout`, and the round goes on.

Real daemon, real gRPC streams: four selected "slowloris" clients open Session uploads
and stall; three honest Clients wait behind them for the only receiving slot. Before the
read deadline the slowloris held the slot forever and the round never completed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated import Client
from sporenet.federated.common.wire import method_path
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import (
    RawSession,
    ServerProcess,
    fit_task,
    fit_tasks,
    make_model,
    register_raw,
    wait_for,
)
from tests.integration.federated.test_secure_rounds import fit_statuses

CONFIG = """
max_transfers = 2      # one download slot, one upload receiving slot
read_timeout = 1.0
"""


def test_stalled_uploads_lose_their_slot_and_the_round_completes(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    make_model(tmp_path / "init.spore")
    (tmp_path / "server.toml").write_text(CONFIG)
    stalled, honest = 4, 3
    server = server_factory(
        [
            "--config",
            str(tmp_path / "server.toml"),
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            str(honest),
            "--min-available",
            str(stalled + honest),
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "4",
        ]
    ).start()
    release = threading.Event()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        release.wait(60)  # upload only once the slowloris streams are stalled
        return {k: v + 0.5 for k, v in weights.items()}, 10, {}

    clients = [
        Client(server.address, train=train, name=f"h{i}", poll_wait=0.5, max_backoff=0.3)
        for i in range(honest)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    with grpc.insecure_channel(server.address) as channel:
        ids = register_raw(channel, [f"s{i}" for i in range(stalled)])
        for t in threads:
            t.start()
        tasks = fit_tasks(channel, ids)
        sessions = []
        for cid, task in tasks.items():
            s = RawSession(channel)
            header = pb.UploadHeader(
                client_id=cid, task_id=task.task_id, upload_id="u1", total_size=4096, num_samples=1
            )
            s.send(pb.SessionRequest(upload=pb.UploadChunk(header=header)))
            sessions.append(s)
        wait_for(lambda: all(s.all_sent() for s in sessions), what="the stalled headers sent")
        release.set()
        try:
            wait_for(
                lambda: read_status(server.state_dir)["job"]["status"] != "running",
                timeout=120,
                what="the round to complete",
            )
            # Each stalled stream got the slot in turn and lost it at the read deadline.
            for s in sessions:
                code, details = _end(s)
                assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (code, details)
                assert "read_timeout" in details
        finally:
            for c in clients:
                c.stop()
            for s in sessions:
                s.close()
    for t in threads:
        t.join(30)
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    statuses = fit_statuses(server.state_dir)
    assert all(statuses[c.client_id] == "accepted" for c in clients), statuses  # type: ignore[index]
    assert all(statuses[cid] != "accepted" for cid in ids), statuses
    assert server.events("round_published")[0]["clients"] == honest
    assert server.terminate() == 0


def _end(session: RawSession) -> tuple[grpc.StatusCode, str]:
    """The status that ends a stalled stream (after its upload_offset reply)."""
    try:
        for _ in session.call:
            pass
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def test_strangers_are_refused_without_waiting_for_a_pinned_slot(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    # The only receiving slot is held by a stalled upload for up to 600 s; a stranger's
    # upload and an unselected client's must still be refused at once (within their 20 s
    # deadline), not queued behind it.
    make_model(tmp_path / "init.spore")
    (tmp_path / "server.toml").write_text("max_transfers = 2\nread_timeout = 600\n")
    server = server_factory(
        [
            "--config",
            str(tmp_path / "server.toml"),
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            "1",
        ]
    ).start()
    with grpc.insecure_channel(server.address) as channel:
        register = channel.unary_unary(
            method_path("Register"),
            request_serializer=pb.RegisterRequest.SerializeToString,
            response_deserializer=pb.RegisterReply.FromString,
        )
        cid = register(pb.RegisterRequest(client_name="s0"), timeout=30).client_id
        task = fit_task(channel, cid)
        late = register(pb.RegisterRequest(client_name="late"), timeout=30).client_id
        pin = RawSession(channel)
        try:
            header = pb.UploadHeader(
                client_id=cid, task_id=task.task_id, upload_id="u1", total_size=64, num_samples=1
            )
            assert pin.upload_header(header).WhichOneof("kind") == "upload_offset"  # slot held
            for who, code in [
                ("stranger-id", grpc.StatusCode.NOT_FOUND),
                (late, grpc.StatusCode.FAILED_PRECONDITION),  # registered, not selected
            ]:
                s = RawSession(channel)
                s.send(
                    pb.SessionRequest(
                        upload=pb.UploadChunk(
                            header=pb.UploadHeader(
                                client_id=who, task_id=task.task_id, upload_id="x", total_size=64
                            )
                        )
                    )
                )
                got, details = s.refusal()
                assert got == code, (who, got, details)
                s.close()
        finally:
            pin.close()


def test_stalled_secure_messages_end_at_the_read_deadline(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    # SubmitSecure streams that send a header and then nothing, with no client deadline:
    # each must end DEADLINE_EXCEEDED after read_timeout and hold no server thread.
    make_model(tmp_path / "init.spore")
    (tmp_path / "server.toml").write_text("read_timeout = 1.0\nmax_workers = 8\n")
    server = server_factory(
        ["--config", str(tmp_path / "server.toml"), "--model", str(tmp_path / "init.spore")]
    ).start()
    assert server.proc is not None
    with grpc.insecure_channel(server.address) as channel:
        register = channel.unary_unary(
            method_path("Register"),
            request_serializer=pb.RegisterRequest.SerializeToString,
            response_deserializer=pb.RegisterReply.FromString,
        )
        cid = register(pb.RegisterRequest(client_name="s0"), timeout=30).client_id
        threads0 = _threads(server.proc.pid)
        submit = channel.stream_unary(
            method_path("SubmitSecure"),
            request_serializer=pb.SecureChunk.SerializeToString,
            response_deserializer=pb.SecureReply.FromString,
        )
        stall = threading.Event()

        def stalled() -> Iterator[pb.SecureChunk]:
            header = pb.SecureHeader(
                client_id=cid, task_id="r1-fit", stage=pb.SECURE_ADVERTISE_KEYS, total_size=64
            )
            yield pb.SecureChunk(header=header, data=b"x")
            stall.wait(120)

        calls = [submit.future(stalled()) for _ in range(12)]  # more than the slots
        try:
            wait_for(lambda: all(c.done() for c in calls), timeout=90, what="the stalls to end")
            for c in calls:
                assert c.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (c.code(), c.details())
                assert "read_timeout" in c.details()
            assert _threads(server.proc.pid) <= threads0 + 1
        finally:
            stall.set()
    assert server.terminate(timeout=15) == 0


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")
