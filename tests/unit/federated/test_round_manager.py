"""The round state machine driven by hand, with a fake clock: no daemon, no sleeping."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated.errors import ConfigError, StaleTaskError, UpdateRejectedError
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskType
from sporenet.federated.server.rounds import MAX_REFUSALS, RoundManager
from sporenet.lite import read_weights
from tests.integration.federated.helpers import make_model
from tests.unit.federated.round_helpers import FakeClock, submit

HEARTBEAT_TIMEOUT = 30.0
ROUND_TIMEOUT = 600.0


@pytest.fixture
def w0(tmp_path: Path) -> dict[str, np.ndarray]:
    return make_model(tmp_path / "init.spore")


def manager_for(tmp_path: Path, clock: FakeClock, **settings: object) -> RoundManager:
    table = {
        "state_dir": str(tmp_path / "state"),
        "model": str(tmp_path / "init.spore"),
        "min_clients": 2,
        "rounds": 1,
        "heartbeat_timeout": HEARTBEAT_TIMEOUT,
        "round_timeout": ROUND_TIMEOUT,
        "resume_grace": 0.0,
        **settings,
    }
    config = build_config(table, {})
    return RoundManager(config, metrics=Metrics(), logger=logging.getLogger("test"), clock=clock)


Start = Callable[..., RoundManager]


@pytest.fixture
def start(tmp_path: Path, w0: dict, clock: FakeClock) -> Iterator[Start]:
    """start(clients, **settings): a manager whose `clients` registered and had a tick."""
    made: list[RoundManager] = []

    def make(clients: str = "", **settings: object) -> RoundManager:
        m = manager_for(tmp_path, clock, **settings)
        made.append(m)
        for cid in clients:
            m.register(cid, None, {})
        m.tick()
        return m

    yield make
    for m in made:
        m.close()


def test_a_round_opens_folds_the_updates_and_publishes_their_weighted_mean(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("a")
    assert m.job.active is False, "one live client: the phase waits for min_clients"
    m.register("b", None, {})
    m.tick()
    assert m.job.active and m.job.phase == Phase.FIT
    assert m.clients.with_status(Participant.SELECTED) == ["a", "b"]
    deltas = {"a": 1.0, "b": 4.0}
    for cid, shift in deltas.items():
        submit(m, cid, {k: np.full_like(v, shift) for k, v in w0.items()}, 10 if cid == "a" else 30)
    m.tick()
    assert m.job.status == JobStatus.FINISHED and m.job.model_version == 1
    published = read_weights((tmp_path / "state" / "models" / "v00001.spore").read_bytes())
    mean = (10 * 1.0 + 30 * 4.0) / 40
    for k, v in w0.items():
        np.testing.assert_allclose(published[k], v + mean, rtol=1e-6)
    (row,) = m.store.rounds()
    assert row["num_results"] == 2 and row["metrics"]["loss"] == pytest.approx(25.0)
    assert m.get_task("a").type == TaskType.DONE


def test_a_silent_client_is_dropped_when_its_heartbeats_stop_and_replaced(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("abcd", fraction=0.5)
    chosen = m.clients.with_status(Participant.SELECTED)
    assert len(chosen) == 2
    silent, talking = chosen
    clock.advance(HEARTBEAT_TIMEOUT - 1)
    for cid in "abcd":
        if cid != silent:
            m.touch(cid)
    m.tick()
    assert m.clients.status(silent) == Participant.SELECTED, "still within its timeout"
    clock.advance(2)
    m.tick()
    assert m.clients.status(silent) == Participant.DROPPED
    submit(m, talking, {k: np.ones_like(v) for k, v in w0.items()}, 5)
    m.tick()  # one update, min_clients 2: a live spare client is asked instead of closing
    (spare,) = m.clients.with_status(Participant.SELECTED)
    assert spare not in chosen
    assert m.job.status == JobStatus.RUNNING and m.job.attempt == 0


def test_past_the_deadline_the_phase_extends_it_and_counts_an_attempt(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("ab")
    submit(m, "a", {k: np.ones_like(v) for k, v in w0.items()}, 5)
    deadline = m.job.deadline
    clock.advance(ROUND_TIMEOUT)
    m.touch("b")  # alive but slow
    m.tick()
    assert m.job.attempt == 1 and m.job.deadline == deadline + ROUND_TIMEOUT
    assert m.job.status == JobStatus.RUNNING


def test_without_enough_clients_the_job_fails_at_wait_timeout(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("a", wait_timeout=60.0)
    clock.advance(59)
    m.touch("a")
    m.tick()
    assert m.job.status == JobStatus.RUNNING
    clock.advance(2)
    m.touch("a")
    m.tick()
    assert m.job.status == JobStatus.FAILED
    assert "only 1 of min_clients=2 clients connected within wait_timeout=60 s" in m.job.reason


def test_a_client_refused_max_refusals_times_sits_out_the_phase(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("ab")
    nan = {k: np.full_like(v, np.nan) for k, v in w0.items()}
    for _ in range(MAX_REFUSALS):
        with pytest.raises(UpdateRejectedError, match="NaN or infinite"):
            submit(m, "a", nan, 5)
    assert m.clients.status("a") == Participant.REJECTED
    with pytest.raises(StaleTaskError, match="status rejected"):
        m.open_upload("a", m.get_task("b").task_id, 10)


def test_an_evaluate_phase_follows_when_asked_and_averages_the_reports(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    m = start("ab", evaluate_every=1)
    for cid in "ab":
        submit(m, cid, {k: np.zeros_like(v) for k, v in w0.items()}, 1)
    m.tick()
    assert (m.job.phase, m.job.round, m.job.status) == (Phase.EVALUATE, 1, JobStatus.RUNNING)
    m.tick()
    task = m.get_task("a")
    assert task.type == TaskType.EVALUATE
    m.report_evaluation("a", task.task_id, loss=1.0, num_samples=1, metrics_json="")
    m.report_evaluation("b", task.task_id, loss=4.0, num_samples=3, metrics_json="")
    m.tick()
    assert m.job.status == JobStatus.FINISHED
    evaluated = [r for r in m.store.rounds() if r["phase"] == "evaluate"]
    assert evaluated[0]["metrics"]["loss"] == pytest.approx((1.0 + 3 * 4.0) / 4)


def test_a_restarted_manager_resumes_the_phase_and_gives_clients_resume_grace(
    tmp_path: Path, w0: dict, clock: FakeClock, start: Start
) -> None:
    first = start("ab")
    submit(first, "a", {k: np.ones_like(v) for k, v in w0.items()}, 5)
    first.close()  # as after a kill -9: nothing more is saved

    clock.advance(3600)  # the daemon was down a long time
    grace = 3 * HEARTBEAT_TIMEOUT
    m = start(resume_grace=grace)
    assert m.clients.status("a") == Participant.ACCEPTED
    assert m.clients.status("b") == Participant.SELECTED
    clock.advance(grace - 1)
    m.tick()
    assert m.clients.status("b") == Participant.SELECTED, "within resume_grace: not silent"
    submit(m, "b", {k: np.full_like(v, 3.0) for k, v in w0.items()}, 15)
    m.tick()
    assert m.job.status == JobStatus.FINISHED
    published = read_weights((tmp_path / "state" / "models" / "v00001.spore").read_bytes())
    for k, v in w0.items():  # a's update survived the restart (kept, folded again)
        np.testing.assert_allclose(published[k], v + (5 * 1.0 + 15 * 3.0) / 20, rtol=1e-6)


def test_a_resumed_job_refuses_settings_other_than_its_own(
    tmp_path: Path, clock: FakeClock, w0: dict[str, np.ndarray]
) -> None:
    first = manager_for(tmp_path, clock, rounds=4)
    first.close()
    with pytest.raises(ConfigError, match=r"`rounds` = 3 \(the job has 4\)"):
        manager_for(tmp_path, clock, rounds=3)
    manager_for(tmp_path, clock, rounds=4).close()  # the same settings resume
