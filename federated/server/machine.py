"""The round state machine: where the job is and what time and answers let it do next.

Pure: it holds the job's state (`JobState`) and the open phase's participant statuses
(`Participants`), reads no clock (every transition is given `now`) and does no I/O. The
round manager (rounds.py) asks it what to do, persists what changed in one store
transaction, and tells the transports. Unit tests drive it with plain numbers
(tests/unit/federated/test_machine.py).

A phase is first *waiting* (fewer live clients than it needs), then *active* once
`start` selected its cohort; a plain phase closes when nobody it waits for is left or at
its deadline, and a fit phase short of `min_clients` accepted updates then either asks
replacements (the cloud) or gives up (an edge, which withdraws from the cloud's task).
`advance` moves the job past a closed phase: to the round's evaluate phase, the next
round, or the end of the job.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phases import JobStatus, Participant, Phase
from sporenet.federated.server.state import JobState


@dataclass(frozen=True)
class Rules:
    """The settings the machine's transitions read (from `ServerConfig`)."""

    rounds: int
    min_clients: int
    min_available: int
    fraction: float
    evaluate_fraction: float
    evaluate_every: int
    round_timeout: float
    wait_timeout: float
    heartbeat_timeout: float
    max_fruitless_reselections: int
    seed: int
    # True (the cloud): a fit phase short of min_clients at its deadline asks replacements
    # and extends it. False (an edge): it closes with what arrived, or gives up if short.
    reselect_when_short: bool = True
    # Async jobs: the first buffer asks this many live devices (0: rounds, `fraction`).
    concurrency: int = 0

    @classmethod
    def of(cls, config: ServerConfig, *, reselect_when_short: bool = True) -> Rules:
        return cls(
            rounds=config.rounds,
            min_clients=config.min_clients,
            min_available=config.min_available,
            fraction=config.fraction,
            evaluate_fraction=config.evaluate_fraction,
            evaluate_every=config.evaluate_every,
            round_timeout=config.round_timeout,
            wait_timeout=config.wait_timeout,
            heartbeat_timeout=config.heartbeat_timeout,
            max_fruitless_reselections=config.max_fruitless_reselections,
            seed=config.seed,
            reselect_when_short=reselect_when_short,
            concurrency=config.job.concurrency if config.job.is_async else 0,
        )


class Verdict(StrEnum):
    """What an open plain phase does at a tick."""

    STAY = "stay"  # keep waiting for answers
    CLOSE = "close"  # aggregate (or summarise) it now
    RESELECT = "reselect"  # short of updates: `Step.added` were asked (or the deadline moved)
    FAIL = "fail"  # give up the phase: `Step.reason` says why


@dataclass(frozen=True)
class Step:
    """A tick's verdict, and what it changed in the machine (the caller persists it)."""

    verdict: Verdict
    added: tuple[str, ...] = ()  # replacements selected (RESELECT)
    reason: str = ""  # FAIL
    accepted: int = 0  # accepted answers when it was taken


@dataclass(frozen=True)
class Start:
    """The phase may start: a cohort of `size` out of `live`, which DP charges as a
    sample at `rate` (size/live for a round's uniform sample; 1 for async buffers,
    whose members are whoever finishes first, not a uniform sample)."""

    live: tuple[str, ...]
    size: int
    rate: float


@dataclass(frozen=True)
class Wait:
    """Too few live clients yet; `fail` says why the job gives up ('' keeps waiting)."""

    fail: str = ""


class RoundMachine:
    """The job's position and the open phase's statuses, moved by explicit transitions."""

    def __init__(self, job: JobState, clients: Participants, rules: Rules) -> None:
        self.job = job
        self.clients = clients
        self.rules = rules

    # -- names ------------------------------------------------------------------------

    def secure_run(self) -> str:
        """Names a run of a secure round after its first (the task id, the cohort's seed)."""
        return f"-s{self.job.secure_attempt}" if self.job.secure_attempt else ""

    def task_id(self) -> str:
        """The open phase's task id; a secure round run again gets a new one, so clients
        start fresh secure sessions instead of answering with the failed run's keys."""
        return f"r{self.job.round}-{self.job.phase}{self.secure_run()}"

    def live(self, now: float) -> list[str]:
        return self.clients.live(now, self.rules.heartbeat_timeout)

    def is_running(self, phase: Phase) -> bool:
        """Whether the running job's active phase is of kind `phase`."""
        job = self.job
        return job.status == JobStatus.RUNNING and job.active and job.phase == phase

    def is_open(self, task_id: str, phase: Phase) -> bool:
        """Whether `task_id` names the running job's active phase of kind `phase`."""
        return self.is_running(phase) and task_id == self.task_id()

    # -- starting a phase ----------------------------------------------------------------

    def plan_start(self, now: float) -> Start | Wait:
        """Whether the waiting phase may start at `now`, and with how many clients.

        A fraction of the live clients, at least min_clients: min_available only says
        when a round may start, not how many it asks (DP's sampling rate is this
        cohort's share of the live clients)."""
        job, rules = self.job, self.rules
        fit = job.phase == Phase.FIT
        need = max(rules.min_clients, rules.min_available) if fit else 1
        # Fewer registered than needed: no pass over them (each registration ticks).
        live = self.live(now) if len(self.clients) >= need else []
        if len(live) < need:
            if rules.wait_timeout and not live:
                live = self.live(now)  # only to say how many
            if rules.wait_timeout and now - job.waiting_since > rules.wait_timeout:
                return Wait(
                    f"only {len(live)} of min_clients={need} clients connected within "
                    f"wait_timeout={rules.wait_timeout:g} s"
                )
            return Wait()
        if fit and rules.concurrency:
            return Start(tuple(live), min(len(live), rules.concurrency), 1.0)
        fraction = rules.fraction if fit else rules.evaluate_fraction
        least = rules.min_clients if fit else 1
        size = min(len(live), max(least, math.ceil(fraction * len(live))))
        return Start(tuple(live), size, size / len(live))

    def smallest_rate(self) -> float:
        """The smallest sampling rate a fit phase can be charged (the budget check after
        a publication): `fraction` for rounds, 1 for async buffers."""
        return 1.0 if self.rules.concurrency else self.rules.fraction

    def choose(self, plan: Start) -> list[str]:
        """The cohort: a sample seeded by the job's seed, round, phase and secure run, so
        a restarted server would choose the same."""
        job = self.job
        rng = random.Random(f"{self.rules.seed}-{job.round}-{job.phase}{self.secure_run()}")
        return sorted(rng.sample(list(plan.live), plan.size))

    def start(self, now: float, chosen: list[str]) -> None:
        """The phase is active with `chosen` selected; its deadline is round_timeout away."""
        job = self.job
        job.active, job.attempt = True, 0
        job.fruitless, job.accepted_at_deadline = 0, 0
        job.phase_started, job.deadline = now, now + self.rules.round_timeout
        self.clients.start_phase(chosen)

    # -- an open plain phase ---------------------------------------------------------------

    def silent(self, now: float) -> list[str]:
        """Selected clients silent past heartbeat_timeout, now marked dropped."""
        timeout = self.rules.heartbeat_timeout
        dropped = [
            c
            for c in self.clients.with_status(Participant.SELECTED)
            if self.clients.is_silent(c, now, timeout)
        ]
        for cid in dropped:
            self.clients.set(cid, Participant.DROPPED)
        return dropped

    def step(self, now: float) -> Step:
        """What the open plain phase does at `now` (after `silent` dropped the silent).

        A RESELECT marks its replacements selected and may move the deadline."""
        job, rules = self.job, self.rules
        pending = self.clients.count(Participant.SELECTED)
        accepted = self.clients.count(Participant.ACCEPTED)
        settled = pending == 0 or now >= job.deadline
        if not settled:
            return Step(Verdict.STAY, accepted=accepted)
        if job.phase == Phase.EVALUATE or accepted >= rules.min_clients:
            return Step(Verdict.CLOSE, accepted=accepted)
        if not rules.reselect_when_short and now >= job.deadline:
            return Step(
                Verdict.FAIL,
                reason=f"round {job.round}: {accepted} device update(s) by the deadline, "
                f"min_clients is {rules.min_clients}",
                accepted=accepted,
            )
        return self._reselect(now, accepted, pending)

    def _reselect(self, now: float, accepted: int, pending: int) -> Step:
        """Too few updates: select replacements (and, past the deadline, extend it)."""
        job, rules = self.job, self.rules
        missing = rules.min_clients - accepted - pending
        asked = set(self.clients.selected())
        spare = [c for c in self.live(now) if c not in asked]
        rng = random.Random(f"{rules.seed}-{job.round}-{job.attempt}")
        extra = sorted(rng.sample(spare, min(len(spare), max(missing, 0))))
        if now >= job.deadline:
            if job.attempt and accepted <= job.accepted_at_deadline:
                job.fruitless += 1  # the last reselection brought no update
            else:
                job.fruitless = 0
            job.accepted_at_deadline = accepted
            if job.fruitless >= rules.max_fruitless_reselections:
                return Step(Verdict.FAIL, reason=self.fruitless_reason(accepted), accepted=accepted)
            job.attempt += 1
            job.deadline = now + rules.round_timeout
        elif not extra:
            return Step(Verdict.STAY, accepted=accepted)  # nobody to ask yet
        for cid in extra:
            self.clients.set(cid, Participant.SELECTED)
        return Step(Verdict.RESELECT, tuple(extra), accepted=accepted)

    def fruitless_reason(self, accepted: int) -> str:
        """Why a fit phase gives up: the updates it has, and what became of the others."""
        job, rules = self.job, self.rules
        refused = self.clients.with_status(Participant.REJECTED)
        dropped = self.clients.with_status(Participant.DROPPED)
        parts = [
            f"round {job.round}: only {accepted} of min_clients={rules.min_clients} updates"
            f" accepted, and {job.fruitless} reselection(s) in a row brought no new update"
            f" (max_fruitless_reselections={rules.max_fruitless_reselections})"
        ]
        if refused:
            why = "; ".join(f"{c!r}: {self.clients.refusal(c)}" for c in refused[:5])
            more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
            parts.append(f"every update refused from {why}{more}")
        if dropped:
            parts.append(f"dropped out: {dropped[:5]}" + (" ..." if len(dropped) > 5 else ""))
        return "; ".join(parts)

    # -- leaving a phase -------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Move the job past the phase that just closed: to this round's evaluate phase
        when one is due after a fit phase, else to the next round or the end of the job."""
        job, rules = self.job, self.rules
        every = rules.evaluate_every
        if job.phase == Phase.FIT and every and job.round % every == 0:
            job.phase = Phase.EVALUATE
        elif job.round >= rules.rounds:  # the job ends at its last round and phase
            job.status = JobStatus.FINISHED
            job.reason = f"all {rules.rounds} rounds done"
        else:
            job.phase = Phase.FIT
            job.round += 1
        self._reset(now)

    def retry(self, now: float) -> None:
        """Back to waiting for the same phase (a failed secure run): the next start
        samples a new cohort, seeded by the new run."""
        self.job.secure_attempt += 1
        self.job.active, self.job.attempt, self.job.waiting_since = False, 0, now
        self.clients.end_phase()

    def begin(self, now: float, round_: int, phase: Phase) -> None:
        """Wait to start phase `phase` of round `round_` (an edge's next cloud task)."""
        job = self.job
        job.round, job.phase = round_, phase
        self._reset(now)

    def _reset(self, now: float) -> None:
        job = self.job
        job.active, job.attempt, job.waiting_since = False, 0, now
        job.fruitless, job.accepted_at_deadline = 0, 0
        job.secure_attempt = 0

    def fail(self, reason: str) -> None:
        """End the job as failed."""
        job = self.job
        job.status, job.reason, job.active = JobStatus.FAILED, reason, False

    def finish(self, reason: str) -> None:
        """End the job cleanly (say the privacy budget would be overspent)."""
        job = self.job
        job.status, job.reason, job.active = JobStatus.FINISHED, reason, False
