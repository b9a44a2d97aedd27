"""Secure async buffers on a real daemon with SDK clients on loopback: each buffer is one
SecAgg+ instance among the devices that filled it, each device masks its update scaled
by the staleness weight the server told it, and every published version equals the
plain staleness-weighted buffer within the fixed-point error, also with a member that
vanishes before its masked input (recovered from the others' shares)."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import numpy as np

from sporenet.federated import Client
from sporenet.federated.server.status import read_status
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import make_model, wait_for
from tests.integration.federated.test_async_jobs import check_versions, shift

SAMPLES = [5, 10, 20, 40, 15, 25, 30]
MAX_WEIGHT = 100  # above every sample count: the secure mean is the sample-weighted one
# Buffers of five (SecAgg+'s defaults: a complete graph): each secret has four share
# holders and needs three, so one member may vanish after sharing its keys.
CONFIG = f"""
[secure_aggregation]
enabled = true
clipping_range = 1.0
stage_timeout = 30
max_weight = {MAX_WEIGHT}
"""


class VanishingClient(Client):
    """A real client that stops calling when the masked-input stage reaches it."""

    def _secure_fit(self, task: pb.Task) -> None:
        if task.secure_stage == pb.SECURE_MASKED_INPUT:
            self.stop()
            return
        super()._secure_fit(task)


class HoldingClient(Client):
    """A real client that waits for `release` before its first masked input."""

    release = threading.Event()

    def _secure_fit(self, task: pb.Task) -> None:
        if task.secure_stage == pb.SECURE_MASKED_INPUT:
            self.release.wait(60)
        super()._secure_fit(task)


def run_clients(
    address: str,
    n: int,
    special: dict[int, type[Client]] | None = None,
    hold: dict[int, threading.Event] | None = None,
) -> list[threading.Thread]:
    """Clients c0..c{n-1}, all training at once (`special`: a client's class; `hold`:
    an event its first training waits for). A client finishing while buffer 1's round
    runs is among buffer 2's members."""

    def run(i: int) -> None:
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            if hold and i in hold:
                hold[i].wait(60)
            return {k: v + np.float32(shift(i)) for k, v in weights.items()}, SAMPLES[i], {}

        kind = (special or {}).get(i, Client)
        c = kind(address, train=train, name=f"c{i}", poll_wait=0.5, max_backoff=0.3)
        c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def secure_async_args(
    tmp_path: Path, config: Path, rounds: int, *, clients: int, heartbeat_timeout: float = 1.5
) -> list[str]:
    """The daemon's flags: buffers of five, every client training at once."""
    return [
        "--config",
        str(config),
        "--model",
        str(tmp_path / "init.spore"),
        "--async",
        "--secure",
        "--rounds",
        str(rounds),
        "--min-clients",
        "2",
        "--min-available",
        str(clients),
        "--concurrency",
        str(clients),
        "--buffer-size",
        "5",
        "--keep-models",
        "0",
        "--heartbeat-interval",
        "0.2",
        "--heartbeat-timeout",
        str(heartbeat_timeout),
    ]


def written_job(tmp_path: Path) -> tuple[dict[str, np.ndarray], Path]:
    """The initial model's weights and the job's config file, both written in tmp_path."""
    w0 = make_model(tmp_path / "init.spore", out=8, inp=6)
    config = tmp_path / "job.toml"
    config.write_text(CONFIG)
    return w0, config


def test_secure_buffers_publish_the_plain_async_result_with_a_dropout(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0, config = written_job(tmp_path)
    server = server_factory(secure_async_args(tmp_path, config, 2, clients=7)).start()
    threads = run_clients(server.address, 7, {6: VanishingClient})
    for t in threads[:6]:
        t.join(120)
    assert not any(t.is_alive() for t in threads[:6]), server.logs()[-4000:]
    published = server.events("round_published")
    assert [e["version"] for e in published] == [1, 2]
    # Each buffer is a SecAgg+ instance of five: one lost its masked input from c6 and
    # still published, from the four others.
    formed = server.events("secure_buffer_formed")
    assert len(formed) == 2 and all(len(e["members"]) == 5 for e in formed)
    missing = [
        e
        for e in server.events("secure_stage_closed")
        if e["stage"] == "masked_input" and e["missing"]
    ]
    assert [e["missing"] for e in missing] == [["c6"]], server.logs()[-4000:]
    # Against the plain staleness-weighted mean of what each buffer's contributors sent:
    # the fixed-point error of a weighted mean is at most the bound over the weights'
    # sum, accumulated over the versions.
    bound = max(e["secure_error_bound"] for e in published)
    assert 0 < bound < 1e-3
    atol = 2 * 2 * bound / (min(SAMPLES) * 2 / MAX_WEIGHT) + 1e-6
    sizes = check_versions(server.state_dir, w0, 2, atol=atol)
    assert sorted(sizes) == [4, 5]
    # Buffer 2's first members finished on version 0 while buffer 1's round ran: their
    # weight (1 + 1) ** -0.5 is in the reference, so the check tells weighted from not.
    con = sqlite3.connect(server.state_dir / "state.db")
    try:
        metrics = con.execute(
            "SELECT metrics FROM participants WHERE phase = 'fit' AND status = 'accepted'"
        ).fetchall()
    finally:
        con.close()
    assert max(json.loads(m)["staleness"] for (m,) in metrics) >= 1
    status = read_status(server.state_dir)
    assert status["job"]["status"] == "finished" and status["job"]["model_version"] == 2
    assert server.terminate() == 0


def test_kill9_in_a_secure_buffers_masked_input_then_restart_loses_nothing(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0, config = written_job(tmp_path)
    # No dropouts here: a longer liveness window keeps the held client in the round.
    args = secure_async_args(tmp_path, config, 2, clients=5, heartbeat_timeout=8)
    server = server_factory(args).start()
    hold = type("Held", (HoldingClient,), {"release": threading.Event()})
    threads = run_clients(server.address, 5, {4: hold})

    def masked() -> int:
        return sum(e["stage"] == "masked_input" for e in server.events("secure_message"))

    wait_for(lambda: masked() >= 4, timeout=30, what="four masked inputs in buffer 1")
    server.kill9()
    assert read_status(server.state_dir)["secure_stage"] == "masked_input"  # what was saved
    server.start()
    hold.release.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()[-4000:]
    restored = server.events("secure_buffer_restored")
    assert restored and restored[0]["stage"] == "masked_input"
    # Every member of both buffers counted (none lost with the process), each once.
    assert check_versions(server.state_dir, w0, 2, atol=1e-5) == [5, 5]
    assert read_status(server.state_dir)["job"]["status"] == "finished"
    assert server.terminate() == 0


def test_a_failed_buffer_runs_again_among_its_survivors_and_the_waiting(
    tmp_path: Path,
    server_factory,  # type: ignore[no-untyped-def]
) -> None:
    w0, config = written_job(tmp_path)
    server = server_factory(secure_async_args(tmp_path, config, 1, clients=7)).start()
    # c5 and c6 finish first, so they are in buffer 1 with three of the others; both
    # vanish at the masked input, which leaves each secret two of the three shares it
    # needs: the round fails and runs again among the three and the two that waited.
    go = threading.Event()
    threads = run_clients(
        server.address, 7, {5: VanishingClient, 6: VanishingClient}, dict.fromkeys(range(5), go)
    )

    def ready() -> set[str]:
        return {e["client"] for e in server.events("secure_buffer_ready")}

    wait_for(lambda: {"c5", "c6"} <= ready(), timeout=30, what="c5 and c6 ready")
    go.set()
    for t in threads[:5]:
        t.join(120)
    assert not any(t.is_alive() for t in threads[:5]), server.logs()[-4000:]
    (retried,) = server.events("secure_buffer_retried")
    assert retried["attempt"] == 1 and len(retried["kept"]) == 3
    assert not {"c5", "c6"} & set(retried["kept"])
    formed = server.events("secure_buffer_formed")
    assert len(formed) == 2 and not {"c5", "c6"} & set(formed[1]["members"])
    assert check_versions(server.state_dir, w0, 1, atol=1e-5) == [5]
    assert read_status(server.state_dir)["job"]["status"] == "finished"
    assert server.terminate() == 0
