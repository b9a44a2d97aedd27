"""Abandoned transfers leak nothing: after hundreds of cancelled, timed-out and
disconnected Session downloads and uploads, and uploads that stall after their header
(slowloris), a normal round completes, SIGTERM ends the
daemon cleanly within 15 s, and its thread count and RSS are back within 10% of where
they were before the abuse (read from /proc/PID/status).

Two raw "fault" clients are selected with two honest Clients (whose training waits for
the abuse to end); the fault clients then go silent, are dropped, and the honest updates
make the round.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.common.wire import method_path
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import (
    RawSession,
    ServerProcess,
    fit_tasks,
    make_model,
    register_raw,
    wait_for,
)

CONFIG = """
chunk_size = 1024     # a 256 KiB model is 257 chunks: every download is cut mid-way
max_transfers = 4
max_workers = 8
read_timeout = 2.0
"""


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, resident KiB) of a process, from /proc/PID/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    return int(fields["Threads"][0]), int(fields["VmRSS"][0])


def thread_names(pid: int) -> Counter[str]:
    """How many threads of a process carry each name (to say what leaked)."""
    return Counter(p.read_text().strip() for p in Path(f"/proc/{pid}/task").glob("*/comm"))


def abuse(
    address: str, cids: list[str], tasks: dict[str, pb.Task], rounds: int, tag: str
) -> dict[str, int]:
    """Cancelled, timed-out and disconnected downloads and uploads; counts by kind."""
    counts = dict.fromkeys(
        [
            "download_cancel",
            "download_deadline",
            "download_disconnect",
            "upload_cancel",
            "upload_disconnect",
            "upload_header_cancel",
        ],
        0,
    )
    download = pb.SessionRequest
    deadline_codes: Counter[str] = Counter()
    with grpc.insecure_channel(address) as channel:
        for i in range(rounds):
            cid = cids[i % len(cids)]
            task = tasks[cid]
            # 1. A download cancelled after its first chunk.
            s = RawSession(channel)
            s.send(
                download(
                    download=pb.DownloadRequest(client_id=cid, model_version=task.model_version)
                )
            )
            s.receive("model")
            s.close()
            counts["download_cancel"] += 1
            # 2. A download (odd chunk size: read from the file) whose deadline passes
            #    while the client reads nothing.
            requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
            call = channel.stream_stream(method_path("Session"))(
                iter(requests.get, None), timeout=0.3
            )
            requests.put(
                download(
                    download=pb.DownloadRequest(
                        client_id=cid, model_version=task.model_version, chunk_size=1000
                    )
                ).SerializeToString()
            )
            wait_for(call.done, what="the download's deadline")
            requests.put(None)
            assert call.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK)
            deadline_codes[call.code().name] += 1
            counts["download_deadline"] += 1
            # 3. An upload cancelled half-way, under a fresh upload id each time.
            s = RawSession(channel)
            header = pb.UploadHeader(
                client_id=cid,
                task_id=task.task_id,
                upload_id=f"{tag}a{i}",
                total_size=8192,
                num_samples=1,
            )
            reply = s.upload_header(header)
            if reply.WhichOneof("kind") == "upload_offset":
                s.upload_data(bytes(8192), 0, 4096, 1024)
                wait_for(lambda s=s: s.all_sent() or s.call.done(), what="the half upload sent")
            s.close()
            counts["upload_cancel"] += 1
            # 4. An upload header, then cancel before any reply.
            s = RawSession(channel)
            s.send(pb.SessionRequest(upload=pb.UploadChunk(header=header)))
            s.close()
            counts["upload_header_cancel"] += 1
            if i % 5 == 0:
                # 5. Disconnects: the whole connection goes away mid-download / mid-upload.
                with grpc.insecure_channel(address) as other:
                    s = RawSession(other)
                    s.send(
                        download(
                            download=pb.DownloadRequest(
                                client_id=cid, model_version=task.model_version
                            )
                        )
                    )
                    s.receive("model")
                counts["download_disconnect"] += 1
                with grpc.insecure_channel(address) as other:
                    s = RawSession(other)
                    reply = s.upload_header(
                        pb.UploadHeader(
                            client_id=cid,
                            task_id=task.task_id,
                            upload_id=f"{tag}d{i}",
                            total_size=8192,
                            num_samples=1,
                        )
                    )
                    if reply.WhichOneof("kind") == "upload_offset":
                        s.upload_data(bytes(8192), 0, 2048, 1024)
                counts["upload_disconnect"] += 1
    print(f"deadline downloads ended {dict(deadline_codes)}")
    return counts


def slowloris(
    address: str, cids: list[str], tasks: dict[str, pb.Task], count: int, tag: str
) -> Counter[str]:
    """`count` uploads that send their header and then nothing, all at once over a few
    connections: each must lose its receiving slot (the server's read deadline) or never
    get one; returns how their streams ended, by status (or reply kind)."""
    ended: Counter[str] = Counter()
    lock = threading.Lock()
    channels = [grpc.insecure_channel(address) for _ in range(4)]

    def stall(i: int) -> None:
        cid = cids[i % len(cids)]
        header = pb.UploadHeader(
            client_id=cid,
            task_id=tasks[cid].task_id,
            upload_id=f"{tag}s{i}",
            total_size=8192,
            num_samples=1,
        )
        s = RawSession(channels[i % len(channels)])
        try:
            reply = s.upload_header(header)
            kind = reply.WhichOneof("kind")
            if kind == "upload_offset":
                wait_for(s.call.done, timeout=120, what="a stalled upload to be ended")
                kind = s.call.code().name
        except grpc.RpcError as exc:
            kind = exc.code().name
        finally:
            s.close()
        with lock:
            ended[kind] += 1

    try:
        stallers = [threading.Thread(target=stall, args=(i,)) for i in range(count)]
        for t in stallers:
            t.start()
        for t in stallers:
            t.join(300)
    finally:
        for channel in channels:
            channel.close()
    print(f"slowloris: {count} stalled uploads ended {dict(ended)}")
    return ended


def run(tmp_path: Path, factory: Callable[..., ServerProcess], rounds: int, stalled: int) -> None:
    make_model(tmp_path / "init.spore", out=256, inp=256)
    (tmp_path / "server.toml").write_text(CONFIG)
    server = factory(
        [
            "--config",
            str(tmp_path / "server.toml"),
            "--model",
            str(tmp_path / "init.spore"),
            "--rounds",
            "1",
            "--min-clients",
            "2",
            "--min-available",
            "4",
            "--heartbeat-interval",
            "0.2",
            "--heartbeat-timeout",
            "3",
            # The daemon's threads and RSS are read after the job; without this it may
            # already have exited once its clients were told.
            "--keep-serving",
        ]
    ).start()
    assert server.proc is not None
    release = threading.Event()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        release.wait(300)
        return {k: v + 0.25 for k, v in weights.items()}, 10, {}

    clients = [
        Client(server.address, train=train, name=f"h{i}", poll_wait=0.5, max_backoff=0.3)
        for i in range(2)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    with grpc.insecure_channel(server.address) as channel:
        cids = register_raw(channel, [f"f{i}" for i in range(2)])
        for t in threads:
            t.start()
        box = fit_tasks(channel, cids)
        # Warm: every client registered, the round open, the model cache encoded, and
        # the worker pools grown to what a few transfers of each kind use.
        wait_for(lambda: all(c.rounds_trained == 0 and c.client_id for c in clients))
        abuse(server.address, cids, box, 5, "warm")
        threads0, rss0 = proc_status(server.proc.pid)
        names0 = thread_names(server.proc.pid)
        counts = abuse(server.address, cids, box, rounds, "x")
        ended = slowloris(server.address, cids, box, stalled, "x")
    # Every stalled upload ended (no hang), none with an unexplained status.
    assert sum(ended.values()) == stalled, ended
    assert not {"UNKNOWN", "INTERNAL", "OK"} & set(ended), ended
    total = sum(counts.values())
    release.set()
    try:
        wait_for(
            lambda: read_status(server.state_dir)["job"]["status"] != "running",
            timeout=120,
            what="the round after the abuse to complete",
        )
    finally:
        for c in clients:
            c.stop()
    for t in threads:
        t.join(30)
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    assert server.events("round_published")[0]["clients"] == 2
    # The abandoned calls' slots are free: the threads and memory they held are gone.
    try:
        wait_for(
            lambda: proc_status(server.proc.pid)[0] <= threads0 * 1.1,  # type: ignore[union-attr]
            timeout=30,
            what="the server's threads to settle",
        )
    except TimeoutError:
        raise AssertionError((names0, thread_names(server.proc.pid))) from None
    threads1, rss1 = proc_status(server.proc.pid)
    print(
        f"load-and-fault: {total} abandoned transfers {counts}; threads {threads0} -> "
        f"{threads1}, RSS {rss0} -> {rss1} KiB"
    )
    assert threads1 <= threads0 * 1.1
    assert rss1 <= rss0 * 1.1
    assert server.terminate(timeout=15) == 0


def test_hundreds_of_abandoned_transfers_leak_nothing(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    run(tmp_path, server_factory, 60, stalled=12)


@pytest.mark.slow
def test_a_thousand_abandoned_transfers_and_a_hundred_stalled_uploads_leak_nothing(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    run(tmp_path, server_factory, 240, stalled=100)
