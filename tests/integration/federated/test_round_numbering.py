"""Round numbers in events and status: an evaluation is logged with its own round,
`job_finished` comes after the last phase, and a finished job shows its last round."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np

from sporenet.federated import Client
from tests.integration.federated.helpers import make_model, status_command


def test_events_and_status_carry_the_round_they_belong_to(tmp_path: Path, server_factory) -> None:  # type: ignore[no-untyped-def]
    make_model(tmp_path / "init.spore")
    args = ["--model", str(tmp_path / "init.spore"), "--rounds", "2", "--min-clients", "2"]
    server = server_factory([*args, "--evaluate-every", "1"]).start()

    def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return {k: v + 1.0 for k, v in weights.items()}, 4, {}

    def evaluate(weights: dict[str, np.ndarray], config: dict) -> tuple:
        return 0.5, 4, {}

    def run(i: int) -> None:
        c = Client(server.address, train=train, evaluate=evaluate, name=f"c{i}", poll_wait=1.0)
        c.run()
        c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), server.logs()

    names = ("phase_started", "round_published", "evaluation_finished", "job_finished")
    events = []
    for line in server.logs().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("event") in names:
            events.append((e["event"], e.get("round"), e.get("phase")))
    assert events == [
        ("phase_started", 1, "fit"),
        ("round_published", 1, None),
        ("phase_started", 1, "evaluate"),
        ("evaluation_finished", 1, None),
        ("phase_started", 2, "fit"),
        ("round_published", 2, None),
        ("phase_started", 2, "evaluate"),
        ("evaluation_finished", 2, None),
        ("job_finished", None, None),
    ], events
    job = status_command(server.state_dir)["job"]
    assert (job["status"], job["round"], job["phase"]) == ("finished", 2, "evaluate")
    assert server.terminate() == 0
