"""A client or an edge whose server is not there says so: the address and gRPC's error in
one warning, then summaries, and in its status; a client gives up after a finite time."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from sporenet.federated import Client, FederatedError
from sporenet.federated.client.client import GIVE_UP_AFTER
from tests.integration.federated.helpers import free_port, status_command, wait_for


def _train(weights, config):  # type: ignore[no-untyped-def]
    return weights, 1, {}


def test_a_client_says_it_cannot_reach_its_server(caplog: pytest.LogCaptureFixture) -> None:
    assert Client("127.0.0.1:1", train=_train).give_up_after == GIVE_UP_AFTER
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    client = Client(dead, train=_train, give_up_after=4.0, max_backoff=0.3)
    assert client.status()["state"] == "connecting"
    raised: list[BaseException] = []

    def run() -> None:
        try:
            client.run()
        except BaseException as e:
            raised.append(e)

    caplog.set_level(logging.WARNING, logger="sporenet.federated.client")
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: client.status()["state"] == "unreachable", 30, what="unreachable status")
    status = client.status()
    assert status["address"] == dead and "UNAVAILABLE" in status["error"], status
    assert status["unreachable_since"] is not None
    thread.join(60)
    assert raised and isinstance(raised[0], FederatedError), raised
    assert dead in str(raised[0]) and "unreachable for 4 s" in str(raised[0])
    warnings = [r.getMessage() for r in caplog.records if r.name == "sporenet.federated.client"]
    first = [w for w in warnings if w.startswith(f"cannot reach server {dead} (UNAVAILABLE")]
    # Said once with its cause, not once per retry (about 15 retries in 4 s at 0.3 s).
    assert len(first) == 1, warnings
    assert client.status()["attempts"] > 3


def test_an_edge_says_it_cannot_reach_the_cloud(tmp_path: Path, edge_factory) -> None:  # type: ignore[no-untyped-def]
    dead = f"127.0.0.1:{free_port()}"
    edge = edge_factory("edge", dead, ["--min-clients", "1"]).start()
    wait_for(lambda: edge.events("upstream_unreachable"), 60, what="upstream_unreachable")
    (event,) = edge.events("upstream_unreachable")
    assert event["address"] == dead and "UNAVAILABLE" in event["error"], event
    upstream = status_command(edge.state_dir)["upstream"]
    assert upstream["state"] == "unreachable" and upstream["address"] == dead, upstream
    assert edge.proc is not None and edge.proc.poll() is None  # it keeps retrying
