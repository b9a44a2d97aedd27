"""A round that cannot gather enough valid updates fails the job instead of reselecting
forever, and `Client.run()` raises JobFailedError with the server's reason.

A real `sporenet-server` subprocess and real Clients on loopback: one client's every
update is non-finite, so with min_clients = 2 the round can never close.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from sporenet.federated import Client, JobFailedError
from sporenet.federated.server.status import read_status
from tests.integration.federated.helpers import make_model


def test_a_client_whose_every_update_is_refused_fails_the_job_with_a_reason(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "1", "--min-clients", "2"]
    server = server_factory(
        [*args, "--round-timeout", "2", "--max-fruitless-reselections", "2"]
    ).start()

    def good(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: v + 1.0 for k, v in weights.items()}, 4, {}

    def bad(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: np.full_like(v, np.nan) for k, v in weights.items()}, 4, {}

    errors: dict[str, BaseException | None] = {}

    def run(name: str, train) -> None:  # type: ignore[no-untyped-def]
        client = Client(server.address, train=train, name=name, poll_wait=1.0)
        try:
            client.run()
            errors[name] = None
        except BaseException as e:  # the assertion below says what was raised
            errors[name] = e
        finally:
            client.close()

    threads = [
        threading.Thread(target=run, args=(name, fn), daemon=True)
        for name, fn in (("good", good), ("bad", bad))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()

    job = read_status(server.state_dir)["job"]
    assert job["status"] == "failed", job
    reason = job["reason"]
    assert "only 1 of min_clients=2 updates accepted" in reason, reason
    assert "2 reselection(s) in a row brought no new update" in reason, reason
    assert "every update refused from 'bad'" in reason and "NaN or infinite" in reason, reason
    # Both clients are told, with the server's reason, instead of polling on.
    for name in ("good", "bad"):
        assert isinstance(errors[name], JobFailedError), errors
        assert reason in str(errors[name])
    # Each deadline past the first counted one reselection; the third one failed the job.
    assert [e["attempt"] for e in server.events("phase_reselected")] == [1, 2]
    assert len(server.events("job_failed")) == 1
    assert server.proc.wait(60) == 1  # the daemon of a failed job exits 1
