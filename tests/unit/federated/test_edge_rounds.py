"""The edge's round manager driven by hand with a fake clock: a cloud task becomes a local
phase, its close keeps the devices' weighted mean and total weight, a short phase
withdraws at its deadline, a restart picks up the task in hand."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated.edge.rounds import EdgeRoundManager, TaskState
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.phases import JobStatus, Phase, TaskType
from tests.integration.federated.helpers import make_model
from tests.unit.federated.round_helpers import FakeClock, submit

ROUND_TIMEOUT = 60.0


@pytest.fixture
def model(tmp_path: Path) -> bytes:
    make_model(tmp_path / "init.spore")
    return (tmp_path / "init.spore").read_bytes()


@pytest.fixture
def made() -> Iterator[list[EdgeRoundManager]]:
    managers: list[EdgeRoundManager] = []
    yield managers
    for m in managers:
        m.close()


def edge(tmp_path: Path, clock: FakeClock, made: list, **settings: object) -> EdgeRoundManager:
    table = {
        "state_dir": str(tmp_path / "edge"),
        "model": str(tmp_path / "init.spore"),
        "min_clients": 2,
        "round_timeout": ROUND_TIMEOUT,
        "resume_grace": 0.0,
        **settings,
    }
    m = EdgeRoundManager(
        build_config(table, {}), metrics=Metrics(), logger=logging.getLogger("t"), clock=clock
    )
    made.append(m)
    return m


def running(
    tmp_path: Path,
    clock: FakeClock,
    made: list,
    model: bytes,
    devices: str = "ab",
    **settings: object,
) -> EdgeRoundManager:
    """An edge whose `devices` registered, then the cloud's task r1-fit began."""
    m = edge(tmp_path, clock, made, **settings)
    for cid in devices:
        m.rounds.register(cid, None, {})
    begin(m, model)
    m.rounds.tick()
    return m


def filled(m: EdgeRoundManager, value: float) -> dict[str, np.ndarray]:
    """A delta of `value` everywhere, shaped as the edge's model."""
    return {k: np.full_like(v, value) for k, v in m.rounds.model.weights.items()}


def begin(m: EdgeRoundManager, model: bytes, task_id: str = "r1-fit") -> None:
    config = {"round": 1, "proximal_mu": 0.25}
    m.begin(task_id=task_id, phase=Phase.FIT, cloud_round=1, config=config, model=model)


def test_a_cloud_task_runs_among_devices_and_keeps_their_weighted_mean(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = edge(tmp_path, clock, made)
    for cid in ("a", "b", "c"):
        m.rounds.register(cid, None, {})
    m.rounds.tick()
    assert m.rounds.get_task("a").type == TaskType.WAIT  # no cloud task yet: nothing starts
    begin(m, model)
    m.rounds.tick()
    task = m.rounds.get_task("a")
    assert task.type == TaskType.FIT and task.config["proximal_mu"] == 0.25  # the cloud's
    rng = np.random.default_rng(0)
    shapes = {k: v.shape for k, v in m.rounds.model.weights.items()}
    deltas = {
        c: {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for c in "abc"
    }
    samples = {"a": 3, "b": 5, "c": 12}
    for c in "abc":
        submit(m.rounds, c, deltas[c], samples[c])
    m.rounds.tick()
    result = m.result("r1-fit")
    assert result is not None and result.delta is not None
    assert result.weight == 20
    assert result.metrics["loss"] == pytest.approx((9 + 25 + 144) / 20)
    for k in shapes:
        want = sum(samples[c] * deltas[c][k].astype(np.float64) for c in "abc") / 20
        np.testing.assert_allclose(result.delta[k], want, rtol=1e-6, atol=1e-7)
    # until the next task
    assert not m.rounds.job.active and m.rounds.get_task("a").type == TaskType.WAIT


def test_too_few_device_updates_by_the_deadline_withdraws_from_the_cloud_task(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = running(tmp_path, clock, made, model, min_clients=2)
    submit(m.rounds, "a", filled(m, 1.0), 4)
    clock.now += ROUND_TIMEOUT - 1
    m.rounds.touch("b")  # still training, heartbeating
    m.rounds.tick()
    assert m.rounds.job.active  # before the deadline it waits
    clock.now += 2
    m.rounds.touch("b")
    m.rounds.tick()
    assert m.task is not None and m.task.state == TaskState.WITHDRAWN
    assert "1 device update(s) by the deadline, min_clients is 2" in m.task.reason
    assert m.result("r1-fit") is None
    assert m.rounds.job.status == JobStatus.RUNNING  # the edge goes on with the cloud's next task
    begin(m, model, task_id="r2-fit")
    m.rounds.touch("a")
    m.rounds.tick()
    assert m.rounds.job.active and m.rounds.get_task("a").type == TaskType.FIT


def test_enough_updates_at_the_deadline_report_what_arrived(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = running(tmp_path, clock, made, model, min_clients=1)
    submit(m.rounds, "a", filled(m, 0.5), 7)
    clock.now += ROUND_TIMEOUT + 1
    m.rounds.touch("b")  # a straggler: alive, but late
    m.rounds.tick()
    result = m.result("r1-fit")
    assert result is not None and result.weight == 7
    assert all(np.all(d == 0.5) for d in result.delta.values())  # type: ignore[union-attr]


def test_a_restarted_edge_resumes_the_task_in_hand(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = running(tmp_path, clock, made, model)
    submit(m.rounds, "a", filled(m, 2.0), 1)
    m.stop()
    m.close()
    made.remove(m)

    again = edge(tmp_path, clock, made)
    begin(again, model)  # the cloud hands the same task again: a no-op
    assert again.rounds.job.active and again.task is not None and again.task.state == TaskState.OPEN
    again.rounds.touch("b")
    submit(again.rounds, "b", filled(again, 0.0), 1)
    again.rounds.tick()
    result = again.result("r1-fit")
    assert result is not None and result.weight == 2  # "a" was not lost
    assert all(np.allclose(d, 1.0) for d in result.delta.values())  # type: ignore[union-attr]


def test_the_cloud_job_ending_gives_devices_the_final_model(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = edge(tmp_path, clock, made)
    m.rounds.register("a", None, {})
    m.rounds.register("b", None, {})
    begin(m, model)
    other = tmp_path / "final.spore"
    make_model(other, seed=3)
    final = bytearray(other.read_bytes())
    m.finish(bytes(final), "the cloud's job is done")
    task = m.rounds.get_task("a")
    assert task.type == TaskType.DONE and task.model is not None
    assert m.rounds.models.path(task.model).read_bytes() == bytes(final)
    assert not m.all_told_done(0.0)  # "a" has not downloaded it yet
    m.rounds.told_done("a", task.model)  # what the transport reports after the download
    assert not m.all_told_done(0.0)  # "b" has not polled since: the edge keeps serving
    task = m.rounds.get_task("b")
    assert task.type == TaskType.DONE and not m.all_told_done(0.0)
    m.rounds.told_done("b", task.model)
    assert m.all_told_done(0.0)


def test_waiting_on_a_task_and_withdrawing_when_the_cloud_closed_it(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = running(tmp_path, clock, made, model)
    assert not m.wait("r1-fit", 0.01)  # the devices are still at work
    assert m.wait("r0-fit", 0.0)  # not the task in hand: nothing to wait for
    m.withdraw("r1-fit", "the cloud closed task 'r1-fit'")
    assert m.wait("r1-fit", 0.0) and m.result("r1-fit") is None
    assert not m.rounds.job.active and m.rounds.get_task("a").type == TaskType.WAIT
    assert m.task is not None and m.task.reason == "the cloud closed task 'r1-fit'"


def test_a_partial_aggregate_survives_a_restart_before_it_was_sent(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = running(tmp_path, clock, made, model)
    submit(m.rounds, "a", filled(m, 3.0), 1)
    submit(m.rounds, "b", filled(m, 1.0), 3)
    m.rounds.tick()
    before = m.result("r1-fit")
    m.close()  # as after kill -9: nothing more is written
    made.remove(m)

    again = edge(tmp_path, clock, made)
    begin(again, model)  # the cloud hands the same task again
    assert again.wait("r1-fit", 0.0) and not again.rounds.job.active  # nothing is recomputed
    after = again.result("r1-fit")
    assert before is not None and after is not None and after.weight == before.weight == 4
    for k, d in after.delta.items():  # type: ignore[union-attr]
        np.testing.assert_array_equal(d, before.delta[k])  # type: ignore[index]
        np.testing.assert_allclose(d, 1.5)


def test_a_task_id_on_another_model_is_a_new_task(
    tmp_path: Path, clock: FakeClock, model: bytes, made: list
) -> None:
    m = running(tmp_path, clock, made, model, "a", min_clients=1)
    submit(m.rounds, "a", filled(m, 1.0), 2)
    m.rounds.tick()
    assert m.result("r1-fit") is not None
    other = tmp_path / "other.spore"
    make_model(other, seed=5)  # a cloud job started afresh hands out "r1-fit" again
    begin(m, other.read_bytes())
    assert m.result("r1-fit") is None and not m.wait("r1-fit", 0.0)  # not the old result
    assert m.rounds.job.model_version == 1 and m.rounds.job.round == 2
