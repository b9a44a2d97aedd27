"""The buffered asynchronous fit phase (FedBuff): one buffer of `buffer_size` updates.

An async job's "round" is a buffer. Up to `concurrency` devices train at once, each on
the version that was current when it was asked (its task id names that version); when
one's update arrives `tau` versions later (at most `max_staleness`), the update is
scaled by the staleness weight (strategies/staleness.py) and folded with its sample
count into the buffer's aggregator (acknowledged once a checkpoint holds it), and the
freed slot goes to another live device. A full buffer closes: the publisher applies the
strategy (a server optimizer steps once per buffer) and publishes the next version, and
the devices still training are carried into the next buffer (`follow`), their versions
unchanged.

Selection, heartbeats, validation, the journal and checkpoints are as in a round: each
device's assignment has `round_timeout` to answer, a silent one is dropped, and what a
`kill -9` leaves is restored by `restored` (no accepted update lost, none folded twice).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sporenet.federated.aggregation import Aggregator, Weights
from sporenet.federated.errors import StaleTaskError, quote
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.open_phase import (
    Answer,
    FitResult,
    Tick,
    TickResult,
    Update,
)
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.plain_fit import restore_aggregate
from sporenet.federated.server.restore import Rows
from sporenet.federated.server.state import ModelRecord
from sporenet.federated.strategies.staleness import Staleness, make_staleness

#: The participant-row metric that records an accepted update's staleness (its mean is
#: the buffer's mean staleness in the rounds table).
STALENESS_KEY = "staleness"
#: The participant-row metric of an in-flight device: the version it trains on.
VERSION_KEY = "version"
#: The statuses of a device that trains or is done with the open buffer.
_BUSY = (Participant.SELECTED, Participant.ACCEPTED, Participant.REJECTED)


def scaled(update: Weights, weight: float) -> Weights:
    """`update` times its staleness weight (a secure buffer's member does this itself,
    before masking)."""
    if weight == 1.0:
        return update
    return {k: v * np.asarray(weight, dtype=v.dtype) for k, v in update.items()}


def task_id_for(version: int) -> str:
    """The task id of training on `version` (what the device answers with)."""
    return f"v{version}-async"


@dataclass
class Assignment:
    """A device training on `version` until `deadline`."""

    version: int
    deadline: float

    @property
    def task_id(self) -> str:
        return task_id_for(self.version)

    def row(self) -> dict[str, float]:
        """What its participant row keeps, for a restart."""
        return {VERSION_KEY: float(self.version), "deadline": self.deadline}


class AsyncFit:
    """One buffer of a buffered asynchronous job."""

    kind = Phase.FIT

    def __init__(
        self,
        ctx: JobContext,
        task_config: dict[str, Any],
        assigned: dict[str, Assignment] | None = None,
        *,
        engaged: Callable[[str], bool] | None = None,
    ) -> None:
        self._ctx = ctx
        # Devices busy otherwise (a secure buffer's members), never assigned training.
        self._engaged = engaged
        self._task_config = task_config
        job = ctx.config.job
        self._concurrency = job.concurrency
        self._buffer_size = job.buffer_size
        self._max_staleness = job.max_staleness
        self._staleness: Staleness = make_staleness(job.staleness, job.staleness_options)
        # Central DP: the clipped updates' sum over a fixed denominator, K, noised once
        # per buffer (an update more than K adds no more than C/K, like each of the K).
        self._aggregator: Aggregator = ctx.privacy.make_aggregator(
            ctx.strategy, ctx.model.template, job.buffer_size
        )
        self._assigned: dict[str, Assignment] = dict(assigned or {})
        self._answered: dict[str, str] = {}  # client -> the task id its accepted update answered
        self._records: dict[int, ModelRecord] = {}
        self._since_checkpoint = 0
        self._draws = 0  # selections so far in this buffer (seeds the next)
        # No training device can be dropped before this time (the earliest of their
        # deadlines and silence limits at the last scan, lowered by each new assignment; a
        # call moves a silence limit later, unless `rewound` says otherwise): ticks before
        # it skip the scan, so an update's tick costs no pass over every device training.
        self._drop_check = float("-inf")
        self._rewound = -1

    # -- life cycle ------------------------------------------------------------------

    def start(self, now: float, cohort: list[str]) -> None:
        """The job's first buffer: `cohort` (up to `concurrency` live devices) trains on
        the current version."""
        if self._ctx.privacy.enabled:  # what the ledger records as each buffer's cohort
            self._ctx.job.dp_cohort = self._buffer_size
        self._assign(now, cohort)

    @classmethod
    def restored(cls, ctx: JobContext, task_config: dict[str, Any], rows: Rows) -> AsyncFit:
        """The open buffer after a restart: its aggregate (checkpoint and journal, each
        update scaled again by the staleness it was accepted with) and its in-flight
        devices, each given `resume_grace` at least."""
        phase = cls(ctx, task_config)
        current = ctx.job.model_version

        def refold(cid: str, update: Weights, row: tuple[str, int, dict[str, Any]]) -> Weights:
            tau = int(row[2].get(STALENESS_KEY, 0))
            phase._answered[cid] = task_id_for(current - tau)
            return phase._scaled(update, tau)

        restore_aggregate(ctx, phase._aggregator, rows, refold)
        grace = ctx.clock() + ctx.config.resume_grace
        for cid in ctx.clients.with_status(Participant.SELECTED):
            metrics = rows.get(cid, ("", 0, {}))[2]
            version = int(metrics.get(VERSION_KEY, current))
            deadline = float(metrics.get("deadline", 0.0))
            phase._assigned[cid] = Assignment(version, max(deadline, grace))
        for cid in ctx.clients.with_status(Participant.ACCEPTED):
            if cid not in phase._answered:  # checkpointed: its row still says how stale
                tau = int(rows.get(cid, ("", 0, {}))[2].get(STALENESS_KEY, 0))
                phase._answered[cid] = task_id_for(current - tau)
        phase._since_checkpoint = 0
        return phase

    def follow(self, tx: Any) -> AsyncFit | None:
        """The next buffer, opened in the transaction that publishes this one: the devices
        still training are carried over (those now too stale are let go)."""
        ctx = self._ctx
        job = ctx.job
        if job.status != JobStatus.RUNNING:
            return None
        # The task config is the job's, but for the buffer it names.
        nxt = AsyncFit(ctx, {**self._task_config, "round": job.round})
        for cid, a in self._assigned.items():
            if job.model_version - a.version <= self._max_staleness:
                nxt._assigned[cid] = a
        job.active, job.phase_started, job.deadline = True, ctx.clock(), 0.0
        tx.start_round(job.round, Phase.FIT)
        nxt.save(tx)
        return nxt

    def enter(self) -> None:
        """Make this buffer's statuses current (after `follow`'s transaction committed)."""
        self._ctx.clients.start_phase(self._assigned)

    # -- the devices' calls ------------------------------------------------------------

    def task(self, client_id: str) -> TaskInfo | None:
        a = self._assigned.get(client_id)
        if a is None:
            return None
        ctx = self._ctx
        config = {**self._task_config, **ctx.privacy.task_config(), "model_version": a.version}
        return TaskInfo(TaskType.FIT, ctx.job.round, a.task_id, self._record(a.version), config)

    def _record(self, version: int) -> ModelRecord | None:
        if version == self._ctx.model.record.version:
            return self._ctx.model.record
        if version not in self._records:
            record = self._ctx.store.model(version)
            if record is None:
                return None
            self._records[version] = record
        return self._records[version]

    def owns(self, client_id: str, task_id: str) -> bool:
        a = self._assigned.get(client_id)
        if a is not None and a.task_id == task_id:
            return True
        return self._answered.get(client_id) == task_id

    def wants(self, client_id: str, task_id: str) -> bool:
        a = self._assigned.get(client_id)
        return a is not None and a.task_id == task_id

    def answered(self, client_id: str, task_id: str) -> bool:
        return self._answered.get(client_id) == task_id

    def accepts(self, client_id: str, answer: type[Answer]) -> None:
        ctx = self._ctx
        if answer is not Update:
            raise StaleTaskError(f"client {quote(client_id)}: an async job takes plain updates")
        a = self._assigned.get(client_id)
        if a is None or ctx.clients.status(client_id) != Participant.SELECTED:
            status = ctx.clients.status(client_id)
            raise StaleTaskError(
                f"client {quote(client_id)} has no open task in buffer {ctx.job.round} "
                f"(status {status})"
            )
        tau = ctx.job.model_version - a.version
        if tau > self._max_staleness:
            raise StaleTaskError(
                f"client {quote(client_id)} trained on version {a.version}, {tau} versions "
                f"old: more than max_staleness={self._max_staleness}"
            )

    def submit(self, client_id: str, answer: Answer) -> None:
        """Fold the update scaled by its staleness weight (acknowledged once a checkpoint
        holds it)."""
        if not isinstance(answer, Update):
            raise StaleTaskError("an async buffer takes updates only")
        ctx = self._ctx
        a = self._assigned.pop(client_id)
        tau = ctx.job.model_version - a.version
        n, metrics = answer.num_samples, {**answer.metrics, STALENESS_KEY: float(tau)}
        self._aggregator.add(client_id, self._scaled(answer.tensors, tau), float(n))
        self._answered[client_id] = a.task_id
        ctx.set_status(client_id, Participant.ACCEPTED, n, metrics, journalled=True)
        ctx.commits.accept()
        self._since_checkpoint += 1
        if self._since_checkpoint >= ctx.config.checkpoint_every:
            self.checkpoint()
        ctx.metrics.inc("sporenet_updates_accepted_total")
        if self._full() or not self._all_busy():
            # The buffer closes, or the freed slot has an idle device to go to. Otherwise
            # the round loop has nothing to do for this update (its own ticks drop the
            # silent): a tick per update would rescan the fleet at every arrival.
            ctx.wake.set()

    def _scaled(self, update: Weights, tau: int) -> Weights:
        return scaled(update, self._staleness.weight(tau))

    # -- the round loop's ----------------------------------------------------------------

    def tick(self, now: float) -> TickResult:
        """Let go of silent and late devices, give free slots to idle live ones, and
        close once the buffer is full."""
        self.drop(now)
        if self._full():
            return TickResult(Tick.CLOSE)
        self.refill(now)
        return TickResult(Tick.OPEN)

    def _full(self) -> bool:
        return self._ctx.clients.count(Participant.ACCEPTED) >= self._buffer_size

    def _all_busy(self) -> bool:
        """Whether every registered device trains or is done with this buffer (then no
        free slot can be given)."""
        clients = self._ctx.clients
        return sum(clients.count(b) for b in _BUSY) >= len(clients)

    def refill(self, now: float, *, held: int = 0) -> None:
        """Give the free training slots to idle live devices (`held` of the slots are
        taken by devices that trained and wait for a secure buffer)."""
        free = self._concurrency - len(self._assigned) - held
        if free > 0:
            self._fill(now, free)

    @property
    def assigned(self) -> dict[str, Assignment]:
        """The devices training now (client id -> what on, until when)."""
        return self._assigned

    def drop(self, now: float) -> None:
        """Let go of the training devices that are silent or past their deadline."""
        ctx = self._ctx
        if now < self._drop_check and ctx.clients.rewound == self._rewound:
            return
        self._rewound = ctx.clients.rewound
        timeout = ctx.config.heartbeat_timeout
        gone, check = [], float("inf")
        for cid, a in self._assigned.items():
            limit = min(a.deadline, ctx.clients.last_seen(cid) + timeout)
            # Silent once the last call is more than `timeout` old; late at the deadline.
            if now >= a.deadline or now > limit:
                gone.append(cid)
            else:
                check = min(check, limit)
        self._drop_check = check
        if not gone:
            return
        with ctx.store.transaction() as tx:
            for cid in gone:
                del self._assigned[cid]
                ctx.set_status(cid, Participant.DROPPED, tx=tx)
        ctx.metrics.inc("sporenet_clients_dropped_total", len(gone))
        log_event(ctx.log, "clients_dropped", logging.WARNING, round=ctx.job.round, clients=gone)
        ctx.notify(gone)  # only their tasks changed

    def _fill(self, now: float, free: int) -> None:
        """Assign up to `free` live devices that are neither training nor done with this
        buffer (each device contributes at most once per buffer)."""
        ctx = self._ctx
        if self._all_busy():
            return
        engaged = self._engaged or (lambda _: False)
        idle = [
            c
            for c in ctx.machine.live(now)
            if ctx.clients.status(c) not in _BUSY and not engaged(c)
        ]
        if not idle:
            return
        job = ctx.job
        rng = random.Random(f"{ctx.config.seed}-b{job.round}-{self._draws}")
        self._draws += 1
        chosen = sorted(rng.sample(idle, min(free, len(idle))))
        with ctx.store.transaction() as tx:
            self._assign(now, chosen, tx)
        ctx.notify(chosen)  # only the chosen have new work: the other polls sleep on

    def _assign(self, now: float, chosen: list[str], tx: Any = None) -> None:
        ctx = self._ctx
        version = ctx.job.model_version
        timeout = ctx.config.heartbeat_timeout
        for cid in chosen:
            a = Assignment(version, now + ctx.config.round_timeout)
            self._assigned[cid] = a
            limit = min(a.deadline, ctx.clients.last_seen(cid) + timeout)
            self._drop_check = min(self._drop_check, limit)
            if tx is not None:
                ctx.set_status(cid, Participant.SELECTED, 0, a.row(), tx=tx)
            else:
                ctx.clients.set(cid, Participant.SELECTED)

    def close(self) -> FitResult:
        # Read before result(): adaptive clipping moves the norm for the next buffer.
        clip = getattr(self._aggregator, "clipping_norm", None)
        return FitResult(self._aggregator.result(), clip, {"in_flight": len(self._assigned)})

    def save(self, tx: Any) -> None:
        """Each in-flight device's version and deadline in its row (at the first buffer's
        start, and in the transaction that carries the devices over to the next)."""
        rows = ((cid, Participant.SELECTED, 0, a.row()) for cid, a in self._assigned.items())
        tx.set_participants(self._ctx.job.round, Phase.FIT, rows)

    def checkpoint(self) -> None:
        self._ctx.checkpoint(self._aggregator)
        self._since_checkpoint = 0

    def stage(self) -> str | None:
        return None
