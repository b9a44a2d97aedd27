"""A trickle cannot hold the receiving slots: a selected client that sends an upload
header and then a byte every half second, on several streams at once, holds at most one
slot, loses it once it falls below `min_upload_rate`, and honest clients finish the round.

Before, `read_timeout` bounded each read but not the transfer: a trickle of a 4 KiB
upload kept the only slot for over half an hour, and each stream of the same client
queued for another slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated import Client
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
from tests.integration.federated.test_secure_rounds import fit_statuses
from tests.integration.federated.test_slowloris import _end


def _trickle(session: RawSession, stop: threading.Event) -> None:
    at = 0
    while not stop.wait(0.5):
        session.send(pb.SessionRequest(upload=pb.UploadChunk(offset=at, data=b"x")))
        at += 1


def test_a_trickle_upload_loses_its_slot_and_honest_clients_finish(
    tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    make_model(tmp_path / "init.spore")
    (tmp_path / "server.toml").write_text(
        "max_transfers = 2\nread_timeout = 2.0\n"  # one receiving slot; 2 s of grace
    )
    honest = 3
    server = server_factory(
        [
            *("--config", str(tmp_path / "server.toml")),
            *("--model", str(tmp_path / "init.spore")),
            *("--rounds", "1", "--min-clients", str(honest)),
            *("--min-available", str(honest + 1)),
            *("--heartbeat-interval", "0.2", "--heartbeat-timeout", "10"),
        ]
    ).start()
    release, stop = threading.Event(), threading.Event()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        release.wait(60)  # upload only once the trickles hold (or want) the slot
        return {k: v + 0.5 for k, v in weights.items()}, 10, {}

    clients = [
        Client(server.address, train=train, name=f"h{i}", poll_wait=0.5, max_backoff=0.3)
        for i in range(honest)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    sessions: list[RawSession] = []
    with grpc.insecure_channel(server.address) as channel:
        (trickler,) = register_raw(channel, ["trickler"])
        for t in threads:
            t.start()
        task = fit_tasks(channel, [trickler])[trickler]
        try:
            for upload_id in ("t1", "t2", "t3"):  # three uploads of one client
                s = RawSession(channel)
                header = pb.UploadHeader(
                    client_id=trickler,
                    task_id=task.task_id,
                    upload_id=upload_id,
                    total_size=4096,
                    num_samples=1,
                )
                s.send(pb.SessionRequest(upload=pb.UploadChunk(header=header)))
                threading.Thread(target=_trickle, args=(s, stop), daemon=True).start()
                sessions.append(s)
            release.set()
            wait_for(
                lambda: read_status(server.state_dir)["job"]["status"] != "running",
                timeout=120,
                what="the round to complete",
            )
            ends = [_end(s) for s in sessions]
        finally:
            stop.set()
            for c in clients:
                c.stop()
            for s in sessions:
                s.close()
    for t in threads:
        t.join(30)
    # Its first two uploads gave their slot claim up to the next; the last one lost the
    # slot for its pace, not for silence (it sent a byte every half second).
    assert [code for code, _ in ends[:2]] == [grpc.StatusCode.ABORTED] * 2, ends
    assert all("superseded" in details for _, details in ends[:2]), ends
    code, details = ends[2]
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "min_upload_rate" in details, ends
    assert read_status(server.state_dir)["job"]["status"] == "finished"
    statuses = fit_statuses(server.state_dir)
    assert all(statuses[c.client_id] == "accepted" for c in clients), statuses  # type: ignore[index]
    assert server.events("round_published")[0]["clients"] == honest
    assert server.terminate() == 0
