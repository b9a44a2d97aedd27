"""The pure round machine, driven with plain numbers: no threads, no SQLite, no files."""

from __future__ import annotations

import dataclasses

import pytest

from sporenet.federated.server.machine import RoundMachine, Rules, Start, Verdict, Wait
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phases import JobStatus, Participant, Phase
from sporenet.federated.server.state import JobState

RULES = Rules(
    rounds=2,
    min_clients=2,
    min_available=0,
    fraction=0.5,
    evaluate_fraction=1.0,
    evaluate_every=1,
    round_timeout=60.0,
    wait_timeout=300.0,
    heartbeat_timeout=30.0,
    max_fruitless_reselections=2,
    seed=7,
)
T0 = 1_000.0


def machine(live: str = "", at: float = T0, **rules: object) -> RoundMachine:
    """A machine whose clients `live` (one letter each) were heard from at `at`."""
    clients = Participants()
    for cid in live:
        clients.seen(cid, at)
    return RoundMachine(JobState(waiting_since=T0), clients, dataclasses.replace(RULES, **rules))


def started(live: str, now: float = T0, **rules: object) -> RoundMachine:
    m = machine(live, now, **rules)
    plan = m.plan_start(now)
    assert isinstance(plan, Start)
    m.start(now, m.choose(plan))
    return m


def test_a_phase_waits_for_min_clients_then_fails_at_wait_timeout() -> None:
    m = machine("a", at=T0 + 300)
    assert m.plan_start(T0 + 10) == Wait()
    why = m.plan_start(T0 + 301)
    assert isinstance(why, Wait) and "only 1 of min_clients=2" in why.fail
    assert "wait_timeout=300 s" in why.fail


def test_the_cohort_is_a_seeded_fraction_of_the_live_clients_at_least_min_clients() -> None:
    m = machine("abcdefgh")
    plan = m.plan_start(T0)
    assert isinstance(plan, Start) and plan.size == 4 and len(plan.live) == 8
    chosen = m.choose(plan)
    assert chosen == sorted(chosen) and len(set(chosen)) == 4
    assert machine("abcdefgh").choose(plan) == chosen  # same seed, round, phase: same cohort
    small = machine("abc")
    assert isinstance(p := small.plan_start(T0), Start) and p.size == 2  # ceil(1.5), >= 2


def test_start_opens_the_phase_with_its_deadline() -> None:
    m = started("ab")
    job = m.job
    assert job.active and job.phase_started == T0 and job.deadline == T0 + 60
    assert m.clients.with_status(Participant.SELECTED) == ["a", "b"]
    assert m.task_id() == "r1-fit" and m.is_open("r1-fit", Phase.FIT)
    assert not m.is_open("r1-fit", Phase.EVALUATE) and not m.is_open("r0-fit", Phase.FIT)


def test_a_phase_closes_once_everyone_answered() -> None:
    m = started("ab")
    assert m.step(T0 + 1).verdict == Verdict.STAY
    m.clients.set("a", Participant.ACCEPTED)
    assert m.step(T0 + 2).verdict == Verdict.STAY
    m.clients.set("b", Participant.ACCEPTED)
    step = m.step(T0 + 3)
    assert step.verdict == Verdict.CLOSE and step.accepted == 2


def test_silent_clients_are_dropped_and_replaced() -> None:
    m = machine("abc", min_clients=2, fraction=0.1)
    plan = m.plan_start(T0)
    assert isinstance(plan, Start)
    m.start(T0, m.choose(plan))
    cohort = m.clients.selected()
    (spare,) = set("abc") - set(cohort)
    for cid in "abc":
        m.clients.seen(cid, T0 + 20 if cid != cohort[0] else T0)
    assert m.silent(T0 + 40) == [cohort[0]]
    assert m.clients.status(cohort[0]) == Participant.DROPPED
    m.clients.set(cohort[1], Participant.ACCEPTED)
    step = m.step(T0 + 40)  # nobody left to wait for, one update short
    assert step.verdict == Verdict.RESELECT and step.added == (spare,)
    assert m.clients.status(spare) == Participant.SELECTED
    assert m.job.deadline == T0 + 60  # before the deadline it is not moved


def test_past_the_deadline_short_of_updates_the_deadline_moves_until_fruitless() -> None:
    m = started("ab")
    m.clients.set("a", Participant.ACCEPTED)
    now = T0 + 61
    step = m.step(now)
    assert step.verdict == Verdict.RESELECT and step.added == ()
    assert m.job.attempt == 1 and m.job.deadline == now + 60
    now += 61
    assert m.step(now).verdict == Verdict.RESELECT and m.job.fruitless == 1
    now += 61
    step = m.step(now)
    assert step.verdict == Verdict.FAIL and m.job.fruitless == 2
    assert "only 1 of min_clients=2 updates accepted" in step.reason
    assert "max_fruitless_reselections=2" in step.reason


def test_an_edge_gives_up_a_short_phase_at_its_deadline() -> None:
    m = started("ab", reselect_when_short=False)
    m.clients.set("a", Participant.ACCEPTED)
    assert m.step(T0 + 59).verdict == Verdict.STAY
    step = m.step(T0 + 60)
    assert step.verdict == Verdict.FAIL
    assert step.reason == "round 1: 1 device update(s) by the deadline, min_clients is 2"


def test_enough_updates_at_the_deadline_close_the_phase() -> None:
    m = started("abc", fraction=1.0)
    m.clients.set("a", Participant.ACCEPTED)
    m.clients.set("b", Participant.ACCEPTED)
    assert m.step(T0 + 59).verdict == Verdict.STAY  # "c" may still answer
    assert m.step(T0 + 60).verdict == Verdict.CLOSE


def test_advance_runs_fit_then_evaluate_then_the_next_round_then_ends() -> None:
    m = started("ab")
    m.advance(T0 + 5)
    job = m.job
    assert (job.round, job.phase, job.active, job.waiting_since) == (
        1,
        Phase.EVALUATE,
        False,
        T0 + 5,
    )
    assert m.task_id() == "r1-evaluate"
    m.advance(T0 + 6)
    assert (job.round, job.phase) == (2, Phase.FIT)
    m.advance(T0 + 7)
    assert (job.round, job.phase, job.status) == (2, Phase.EVALUATE, JobStatus.RUNNING)
    m.advance(T0 + 8)
    assert job.status == JobStatus.FINISHED and job.reason == "all 2 rounds done"


def test_an_evaluate_phase_closes_at_its_deadline_whatever_arrived() -> None:
    m = machine("ab", evaluate_every=1)
    m.job.phase = Phase.EVALUATE
    plan = m.plan_start(T0)
    assert isinstance(plan, Start) and plan.size == 2  # evaluate_fraction 1.0
    m.start(T0, m.choose(plan))
    assert m.step(T0 + 59).verdict == Verdict.STAY
    assert m.step(T0 + 60).verdict == Verdict.CLOSE


def test_a_retried_secure_run_has_its_own_task_id_and_cohort_seed() -> None:
    m = started("abcd")
    first = m.task_id()
    m.retry(T0 + 9)
    assert not m.job.active and m.job.secure_attempt == 1 and m.clients.selected() == []
    assert m.task_id() == "r1-fit-s1" != first
    m.advance(T0 + 10)
    assert m.job.secure_attempt == 0 and m.task_id() == "r1-evaluate"


@pytest.mark.parametrize("end", ["fail", "finish"])
def test_ending_the_job(end: str) -> None:
    m = started("ab")
    if end == "fail":
        m.fail("broken")
        assert m.job.status == JobStatus.FAILED
    else:
        m.finish("budget")
        assert m.job.status == JobStatus.FINISHED
    assert not m.job.active and m.job.reason in ("broken", "budget")
    assert not m.is_open("r1-fit", Phase.FIT)
