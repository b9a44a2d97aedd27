"""Every model version is checked against its digest when it is served, not only the
current one at start: a damaged older version is logged at start and never sent."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np

from sporenet.federated.common.codec import encode_update
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import (
    RawSession,
    fit_task,
    make_model,
    register_raw,
    upload_raw,
    wait_for,
)


def _flip_a_byte(path: Path, at: int = 200) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def _download(address: str, client_id: str, version: int) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(address) as channel:
        session = RawSession(channel)
        try:
            session.send(
                pb.SessionRequest(
                    download=pb.DownloadRequest(client_id=client_id, model_version=version)
                )
            )
            return session.refusal()
        finally:
            session.close()


def test_a_damaged_older_version_is_never_served(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    w0 = make_model(tmp_path / "init.spore", out=16, inp=16)
    server = server_factory(
        ["--model", str(tmp_path / "init.spore"), "--rounds", "2", "--min-clients", "1"]
    ).start()
    with grpc.insecure_channel(server.address) as channel:
        (cid,) = register_raw(channel, ["c"])
        task = fit_task(channel, cid)
        delta = {k: np.full_like(v, 0.5) for k, v in w0.items()}
        assert upload_raw(
            channel, client_id=cid, task_id=task.task_id, payload=encode_update(delta)
        ).accepted
    wait_for(lambda: read_status(server.state_dir)["job"]["model_version"] == 1, 60, what="v1")
    v0 = server.state_dir / "models" / "v00000.spore"
    _flip_a_byte(v0)  # while it runs: the next download of v0 finds it
    code, details = _download(server.address, cid, 0)
    assert code == grpc.StatusCode.DATA_LOSS, (code, details)
    assert "model version 0" in details and "is damaged" in details, details

    assert server.terminate() == 0
    server.start()  # a restart finds it at once, and still refuses to send it
    (event,) = server.events("model_damaged")
    assert event["version"] == 0 and "v00000.spore" in event["reason"], event
    code, details = _download(server.address, cid, 0)
    assert code == grpc.StatusCode.DATA_LOSS and "is damaged" in details, (code, details)
    assert server.terminate() == 0
