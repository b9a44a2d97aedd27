"""What the round-manager unit tests share: a clock the test moves by hand (for the state
machines that take `clock=`) and a device's update handed to a manager directly."""

from __future__ import annotations

import numpy as np

from sporenet.federated.common.codec import encode_update
from sporenet.federated.server.phases import TaskType
from sporenet.federated.server.rounds import RoundManager


class FakeClock:
    """Seconds since the epoch, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def submit(m: RoundManager, cid: str, delta: dict[str, np.ndarray], samples: int) -> None:
    """Device `cid` uploads `delta` (trained on `samples` samples, loss = samples) for the
    fit task it is given now, and is told it was accepted: as the session does before it
    answers, the folded update is committed first (group_commit.py)."""
    task = m.get_task(cid)
    assert task.type == TaskType.FIT, task
    m.submit_update(
        cid,
        task.task_id,
        memoryview(encode_update(delta)),
        upload=None,
        mismatch="",
        num_samples=samples,
        metrics_json=f'{{"loss": {samples}}}',
    )
    m.commit()
