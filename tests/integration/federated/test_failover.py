"""A client given several addresses moves to the next one when its server is gone, and
registers and trains there. Two real `sporenet-server` subprocesses on loopback."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated import Client, ConfigError
from tests.integration.federated.helpers import make_model, wait_for


def test_a_client_moves_to_the_next_address_when_its_server_is_killed(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0 = make_model(tmp_path / "init.spore")
    model = ["--model", str(tmp_path / "init.spore"), "--rounds", "1"]
    # The first server waits for a second client that never comes; the second runs the job.
    first = server_factory([*model, "--min-clients", "2"], name="first").start()
    second = server_factory([*model, "--min-clients", "1"], name="second").start()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: v + 1.0 for k, v in weights.items()}, 4, {}

    client = Client(
        [first.address, second.address],
        train=train,
        name="phone",
        poll_wait=0.5,
        max_backoff=0.2,
        failover_after=1.0,
    )
    result: dict[str, object] = {}
    thread = threading.Thread(target=lambda: result.update(final=client.run()), daemon=True)
    thread.start()
    wait_for(lambda: bool(first.events("client_registered")), timeout=60, what="registration")
    assert client.address == first.address
    first.kill9()
    thread.join(120)
    assert not thread.is_alive(), second.logs()
    client.close()

    assert client.address == second.address and client.failovers == 1
    assert second.proc.wait(60) == 0  # the job is done: its log is complete
    assert [e["client"] for e in second.events("client_registered")] == ["phone"]
    np.testing.assert_allclose(result["final"]["w"], w0["w"] + 1.0)  # type: ignore[index]
    assert [e["clients"] for e in second.events("round_published")] == [1]


def test_addresses_are_checked_when_the_client_is_built() -> None:
    def train(weights: dict, config: dict) -> tuple:
        return weights, 1, {}

    with pytest.raises(ConfigError, match="list of them"):
        Client([], train=train)
    with pytest.raises(ConfigError, match=r"'10\.1\.2\.3:9' is not loopback"):
        Client(["127.0.0.1:9", "10.1.2.3:9"], train=train)
    with pytest.raises(ConfigError, match="failover_after"):
        Client(["127.0.0.1:9"], train=train, failover_after=0)
