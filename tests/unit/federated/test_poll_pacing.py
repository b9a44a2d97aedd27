"""The pause a TASK_WAIT answer suggests: short while a round forms, longer for a client a
running round left out, growing with the fleet, jittered, and inside heartbeat_timeout."""

from __future__ import annotations

import pytest

from sporenet.federated.server.pacing import (
    JITTER,
    MIN_PAUSE,
    NOT_SELECTED_FACTOR,
    POLLS_PER_SECOND,
    PollPacer,
)
from sporenet.federated.server.phases import TaskInfo, TaskType

FORMING = TaskInfo(TaskType.WAIT, reason="waiting")
LEFT_OUT = TaskInfo(TaskType.WAIT, reason="not selected")


def pacer(clients: float, *, draw: float = 0.5, heartbeat_timeout: float = 30.0) -> PollPacer:
    return PollPacer(heartbeat_timeout=heartbeat_timeout, clients=lambda: clients, rng=lambda: draw)


def test_a_small_fleet_polls_soon_while_a_round_forms() -> None:
    assert pacer(10).retry_after(FORMING) == pytest.approx(MIN_PAUSE)
    assert pacer(10).retry_after(LEFT_OUT) == pytest.approx(MIN_PAUSE * NOT_SELECTED_FACTOR)


def test_the_pause_grows_with_the_fleet_to_bound_the_poll_rate() -> None:
    for clients in (1_000, 2_000):
        mean = pacer(clients).mean(FORMING)
        assert mean == pytest.approx(clients / POLLS_PER_SECOND)
        assert clients / mean <= POLLS_PER_SECOND + 1e-9


def test_every_pause_keeps_a_client_live() -> None:
    # At the top of the jitter, two polls still fit in heartbeat_timeout.
    for task in (FORMING, LEFT_OUT):
        worst = pacer(1e9, draw=1.0 - 1e-12, heartbeat_timeout=12.0).retry_after(task)
        assert 0 < worst <= 12.0 / 2 + 1e-9


def test_pauses_are_jittered_around_their_mean() -> None:
    low, high = pacer(10, draw=0.0), pacer(10, draw=1.0)
    assert low.retry_after(FORMING) == pytest.approx(MIN_PAUSE * (1 - JITTER))
    assert high.retry_after(FORMING) == pytest.approx(MIN_PAUSE * (1 + JITTER))


def test_a_task_to_do_needs_no_pause() -> None:
    for kind in (TaskType.FIT, TaskType.EVALUATE, TaskType.SECURE_FIT, TaskType.DONE):
        assert pacer(10).retry_after(TaskInfo(kind)) == 0.0
