"""Malicious clients in a secure job on the real daemon: the job completes without them.

One client advertises an all-zero X25519 key (every key agreement with it gives the
all-zero secret), another reveals tampered Shamir shares at unmask. Both are real
Clients whose secure-aggregation session builds its messages and then alters them; the
server is not mocked. The daemon must exclude each by name (an event, the participant's
status) and publish the honest clients' mean.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest

from sporenet.federated import Client
from sporenet.federated.client.secure import SecureTasks
from sporenet.federated.secagg import Stage
from sporenet.federated.secagg.messages import AdvertiseKeys, UnmaskResponse
from sporenet.federated.secagg.session import SecureClientSession
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import ServerProcess, make_model, wait_for
from tests.integration.federated.test_secure_rounds import (
    check_mean,
    fit_statuses,
    join,
    secure_server,
    train_for,
)


class TamperingSession(SecureClientSession):
    """A real client session whose replies are altered after they are built."""

    def __init__(self, attack: str, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.attack = attack

    def _reply(self, stage, payload, update, num_samples):  # type: ignore[no-untyped-def]
        wire = super()._reply(stage, payload, update, num_samples)
        if self.attack == "zero_key" and stage == Stage.ADVERTISE_KEYS:
            msg = AdvertiseKeys.from_bytes(wire)
            return AdvertiseKeys(msg.client, msg.enc_public, bytes(32)).to_bytes()
        if self.attack == "bad_shares" and stage == Stage.UNMASK:
            msg = UnmaskResponse.from_bytes(wire)

            def flip(share: bytes) -> bytes:
                return bytes([share[0] ^ 1]) + share[1:]

            return UnmaskResponse(
                msg.client,
                {v: flip(s) for v, s in msg.key_shares.items()},
                {v: flip(s) for v, s in msg.self_mask_shares.items()},
            ).to_bytes()
        return wire


class MaliciousClient(Client):
    """The real client with a TamperingSession for each secure round it joins."""

    def __init__(self, *args, attack: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.attack = attack
        self.refusals: list[grpc.StatusCode] = []

        self._secure = SecureTasks(
            session=lambda setup, template, max_weight: TamperingSession(
                attack, setup, template, max_weight=max_weight
            )
        )

    def _secure_fit(self, task: pb.Task) -> None:
        try:
            super()._secure_fit(task)
        except grpc.RpcError as e:  # the server refuses it; it keeps polling like a bot
            self.refusals.append(e.code())
            self._secure.sit_out(task.task_id)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(
        "[secure_aggregation]\nenabled = true\nclipping_range = 1.0\nstage_timeout = 30\n"
    )
    return path


def test_zero_key_and_tampered_shares_are_excluded_and_the_job_completes(
    tmp_path: Path, server_factory: Callable[..., ServerProcess], config_file: Path
) -> None:
    # 8 clients, complete graph (k = 7, t = 4): after the zero-key client is gone each
    # secret has 6 holders, enough to locate one bad share (t + 2).
    w0 = make_model(tmp_path / "init.spore", out=4, inp=8)
    n, zero_key, bad_shares = 8, 7, 6
    server = secure_server(server_factory, config_file, tmp_path, n)
    clients: dict[int, Client] = {}
    for i in range(n):
        kwargs = dict(train=train_for(i), name=f"c{i}", poll_wait=0.5, max_backoff=0.3)
        attack = {zero_key: "zero_key", bad_shares: "bad_shares"}.get(i)
        if attack:
            clients[i] = MaliciousClient(server.address, attack=attack, **kwargs)  # type: ignore[arg-type]
        else:
            clients[i] = Client(server.address, **kwargs)  # type: ignore[arg-type]
    threads = {i: threading.Thread(target=c.run, daemon=True) for i, c in clients.items()}
    for t in threads.values():
        t.start()
    try:
        wait_for(
            lambda: read_status(server.state_dir)["job"]["status"] != "running",
            timeout=120,
            what="the secure job to end",
        )
    finally:
        for c in clients.values():
            c.stop()
    join(list(threads.values()), server)
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished", status["job"]
    events = {e["client"]: e for e in server.events("secure_client_excluded")}
    assert set(events) == {f"c{zero_key}", f"c{bad_shares}"}, server.logs()[-4000:]
    assert events[f"c{zero_key}"]["stage"] == "advertise_keys"
    assert "mask_public" in events[f"c{zero_key}"]["reason"]
    assert "disagrees" in events[f"c{bad_shares}"]["reason"]
    # The zero-key client was refused with INVALID_ARGUMENT and never contributed; the
    # share tamperer uploaded its masked input first, so it stays in the sum.
    assert grpc.StatusCode.INVALID_ARGUMENT in clients[zero_key].refusals  # type: ignore[attr-defined]
    statuses = fit_statuses(server.state_dir)
    assert statuses[f"c{zero_key}"] == "excluded"
    honest = [i for i in range(n) if i != zero_key]
    assert all(statuses[f"c{i}"] == "accepted" for i in honest), statuses
    published = server.events("round_published")[0]
    assert set(published["excluded"]) == {f"c{zero_key}", f"c{bad_shares}"}
    assert published["out_of_range"] == 0
    check_mean(server, w0, honest)
    assert np.isfinite(published["secure_error_bound"])
