"""The fit phase of a secure async job: one buffer, one SecAgg+ instance among its fillers.

It composes the two phases it stands between: an `AsyncFit` keeps `concurrency` devices
training, each on the version it downloaded (its slots, deadlines, drops), and once the
buffer's `SecureBuffer` has `buffer_size` devices that finished training, a `SecureFit`
runs the SecAgg+ stages among exactly those. A device that finished answers its training
task with a READY secure message (its update stays on the device); it is then told its
staleness weight with the secure stages and scales its update by it before masking. The
unmasked mean is published like a plain buffer's; devices that finish while a buffer's
round runs wait for the next buffers (each keeps its training slot meanwhile, so no
more devices train than those buffers can take), and those still training are carried
into the next.

Persisted: the training devices in their participant rows (as in AsyncFit); a ready
member's row also names its staleness; the formed buffer (members, weights, the
SecureRound) in the store's secure state, saved with every stage transition. After a
restart, a device whose READY was not yet in a formed buffer is asked for its training
task again and answers READY again (it kept its update, or retrains).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sporenet.federated.common.wire import READY, SECURE_BUFFER_KEY, SECURE_WEIGHT_KEY
from sporenet.federated.errors import AggregationError, StaleTaskError, quote
from sporenet.federated.secagg import Stage
from sporenet.federated.server.async_fit import STALENESS_KEY, VERSION_KEY, Assignment, AsyncFit
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.open_phase import (
    Answer,
    FitResult,
    SecureMessage,
    Tick,
    TickResult,
    Update,
    Withdrawal,
)
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.restore import Rows
from sporenet.federated.server.secure_buffer import SecureBuffer
from sporenet.federated.server.secure_fit import SecureFit
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.secure_setup import SecureSetup
from sporenet.federated.strategies.staleness import Staleness, make_staleness


class SecureAsyncFit:
    """One buffer of a secure async job (see the module docstring)."""

    kind = Phase.FIT

    def __init__(
        self,
        setup: SecureSetup,
        assigned: dict[str, Assignment] | None = None,
        buffer: SecureBuffer | None = None,
    ) -> None:
        ctx = setup.ctx
        self._ctx, self._setup = ctx, setup
        # SecureFit's own retry starts a round's cohort afresh; a buffer's is `_rerun`.
        # Its members trained before the buffer formed: masking takes a stage's time.
        self._retries = setup.settings.retries
        self._stage_setup = dataclasses.replace(
            setup, settings=dataclasses.replace(setup.settings, retries=0), trains=False
        )
        job = ctx.config.job
        self._staleness = staleness_of(ctx)
        self._buffer = buffer or SecureBuffer(job.buffer_size, job.max_staleness, self._staleness)
        self._training = AsyncFit(
            ctx, {**setup.task_config, SECURE_BUFFER_KEY: True}, assigned, engaged=self._engaged
        )
        # Devices whose READY came once the buffer was formed (client id -> version).
        self._waiting: dict[str, int] = {}
        self._ready_task: dict[str, str] = {}  # client -> the training task it answered
        self._stages: SecureFit | None = None
        if self._buffer.secure is not None:
            self._stages = self._secure_fit()

    def _secure_fit(self) -> SecureFit:
        return SecureFit(self._stage_setup, self._buffer.secure, state=self._buffer.to_bytes)

    def _engaged(self, client_id: str) -> bool:
        """Whether the device is done training for this buffer (ready, waiting, in its
        secure round): it is not given another training task."""
        return (
            client_id in self._buffer.members
            or client_id in self._waiting
            or client_id in self._ready_task
        )

    # -- life cycle ------------------------------------------------------------------

    def start(self, now: float, cohort: list[str]) -> None:
        self._training.start(now, cohort)

    @classmethod
    def restored(cls, setup: SecureSetup, rows: Rows, saved: bytes | None) -> SecureAsyncFit:
        """The open buffer after a restart: the formed secure round if one was saved
        (its stage given `resume_grace`), every other selected device training again."""
        ctx = setup.ctx
        buffer = None
        if saved is not None:
            job = ctx.config.job
            buffer = SecureBuffer.from_bytes(saved, job.max_staleness, staleness_of(ctx))
        current = ctx.job.model_version
        grace = ctx.clock() + ctx.config.resume_grace
        cohort = buffer.secure.cohort if buffer is not None and buffer.secure else frozenset()
        assigned = {}
        for cid in ctx.clients.with_status(Participant.SELECTED):
            if cid in cohort:
                continue
            metrics = rows.get(cid, ("", 0, {}))[2]
            version = int(metrics.get(VERSION_KEY, current))
            deadline = float(metrics.get("deadline", 0.0))
            assigned[cid] = Assignment(version, max(deadline, grace))
        phase = cls(setup, assigned, buffer)
        if phase._stages is not None and phase._buffer.secure is not None:
            phase._stage_setup.resume(phase._buffer.secure, "secure_buffer_restored")
        return phase

    def follow(self, tx: Any) -> SecureAsyncFit | None:
        """The next buffer (in the publishing transaction): the training devices carried
        over as in AsyncFit, and those that finished during this buffer's round are its
        first members (their staleness counted anew)."""
        ctx = self._ctx
        job = ctx.job
        nxt_training = self._training.follow(tx)
        if nxt_training is None or job.status != JobStatus.RUNNING:
            return None
        nxt = SecureAsyncFit(self._setup.for_round(job.round), nxt_training.assigned)
        now, timeout = ctx.clock(), ctx.config.heartbeat_timeout
        # The freshest updates first: the members are as little stale as the waiting
        # devices allow (sorted is stable: arrival order among those of one version).
        waiting = sorted(self._waiting.items(), key=lambda item: -item[1])
        for cid, version in waiting:
            if ctx.clients.is_silent(cid, now, timeout):
                continue  # gone while it waited: not a member of a round it cannot join
            if not 0 <= job.model_version - version <= ctx.config.job.max_staleness:
                continue  # now too stale: it trains again
            nxt._ready_task[cid] = self._ready_task.get(cid, "")
            if nxt._buffer.full:  # it keeps its update for the buffer after
                nxt._waiting[cid] = version
                continue
            member = nxt._buffer.ready(cid, version, job.model_version)
            tx.set_participant(
                job.round, Phase.FIT, cid, Participant.SELECTED, 0, _ready_row(version, member.tau)
            )
        return nxt

    def enter(self) -> None:
        self._ctx.clients.start_phase([*self._training.assigned, *self._buffer.members])

    # -- the devices' calls ------------------------------------------------------------

    def task(self, client_id: str) -> TaskInfo | None:
        """A secure stage for a member of the formed round; the training task for a
        device training; otherwise wait (a ready device waits for its buffer to form)."""
        if self._stages is not None and client_id in self._buffer.members:
            info = self._stages.task(client_id)
            if info is not None and info.type == TaskType.SECURE_FIT:
                weight = self._buffer.weight_of(client_id)
                info = dataclasses.replace(info, config={**info.config, SECURE_WEIGHT_KEY: weight})
            return info
        if client_id in self._buffer.members or client_id in self._waiting:
            return TaskInfo(
                TaskType.WAIT,
                self._ctx.job.round,
                retry_after=1.0,
                reason="waiting for the secure buffer to fill",
            )
        return self._training.task(client_id)

    def owns(self, client_id: str, task_id: str) -> bool:
        if self._training.wants(client_id, task_id) or self._ready_task.get(client_id) == task_id:
            return True
        return self._stages is not None and self._stages.owns(client_id, task_id)

    def wants(self, client_id: str, task_id: str) -> bool:
        if self._training.wants(client_id, task_id):
            return True
        return self._stages is not None and self._stages.wants(client_id, task_id)

    def answered(self, client_id: str, task_id: str) -> bool:
        return self._stages is not None and self._stages.answered(client_id, task_id)

    def accepts(self, client_id: str, answer: type[Answer]) -> None:
        if answer is Update:
            raise StaleTaskError(
                f"client {quote(client_id)}: a secure async buffer takes no plain updates "
                "(the client answers its training task with a READY secure message)"
            )
        if self._stages is not None and client_id in self._buffer.members:
            self._stages.accepts(client_id, answer)

    def submit(self, client_id: str, answer: Answer) -> None:
        """A READY (the device finished training), or a message of the formed round."""
        ctx = self._ctx
        if isinstance(answer, SecureMessage) and answer.stage == READY:
            self._ready(client_id, answer)
            return
        if self._stages is None or client_id not in self._buffer.members:
            if isinstance(answer, Withdrawal):  # not in a round: nothing to stop waiting for
                return
            raise StaleTaskError(f"client {quote(client_id)} is not in this buffer's secure round")
        self._stages.submit(client_id, answer)
        secure = self._buffer.secure
        if (
            isinstance(answer, SecureMessage)
            and answer.stage == Stage.MASKED_INPUT.value
            and secure is not None
            and secure.stage == Stage.MASKED_INPUT
        ):
            # Its row keeps how stale it was (SecureFit wrote the client's metrics).
            tau = self._buffer.members[client_id].tau
            metrics = {**answer.metrics, STALENESS_KEY: float(tau)}
            ctx.set_status(client_id, Participant.MASKED, answer.num_samples, metrics)

    def _ready(self, client_id: str, answer: SecureMessage) -> None:
        ctx = self._ctx
        a = self._training.assigned.get(client_id)
        if a is None:
            return  # a resend: its READY is recorded already
        version = ctx.job.model_version
        if self._buffer.secure is not None or self._buffer.full:
            self._waiting[client_id] = a.version
            del self._training.assigned[client_id]
            self._ready_task[client_id] = a.task_id
        else:
            member = self._buffer.ready(client_id, a.version, version)
            del self._training.assigned[client_id]
            self._ready_task[client_id] = a.task_id
            ctx.set_status(client_id, Participant.SELECTED, 0, _ready_row(a.version, member.tau))
        log_event(
            ctx.log, "secure_buffer_ready", round=ctx.job.round, client=client_id, version=a.version
        )
        ctx.wake.set()  # a slot is free (and the buffer may be full)

    # -- the round loop's ----------------------------------------------------------------

    def tick(self, now: float) -> TickResult:
        """Keep devices training; form the round once the buffer has its members; then
        run its stages (SecureFit's tick) until the sum is unmasked."""
        ctx = self._ctx
        self._training.drop(now)
        if self._stages is None:
            for cid in list(self._buffer.members):
                if ctx.clients.is_silent(cid, now, ctx.config.heartbeat_timeout):
                    self._buffer.leave(cid)
                    self._ready_task.pop(cid, None)
                    ctx.set_status(cid, Participant.DROPPED)
            if self._buffer.full:
                self._form(now)
        # A device waiting with its update holds its training slot: while a buffer's
        # round runs, no more devices train than the next buffers can take.
        timeout = ctx.config.heartbeat_timeout
        for cid in [c for c in self._waiting if ctx.clients.is_silent(c, now, timeout)]:
            del self._waiting[cid]  # gone while it waited: its slot is free
            self._ready_task.pop(cid, None)
        self._training.refill(now, held=len(self._waiting))
        if self._stages is None:
            return TickResult(Tick.OPEN)
        result = self._stages.tick(now)
        secure = self._buffer.secure  # formed with the stages
        failed = result.tick == Tick.FAIL and ctx.job.secure_attempt < self._retries
        if failed and secure is not None:
            self._rerun(now, secure, result.reason)
            return TickResult(Tick.OPEN)
        return result

    def _rerun(self, now: float, secure: SecurePhase, reason: str) -> None:
        """The buffer's round failed (too few survivors): its members still alive keep
        their place and their held updates, the devices waiting fill it up again, and the
        next tick forms a new round among them under a new task id (fresh keys)."""
        ctx = self._ctx
        job = ctx.job
        gone = {Participant.DROPPED, Participant.EXCLUDED}
        timeout = ctx.config.heartbeat_timeout
        keep = {
            c: m
            for c, m in self._buffer.members.items()
            if ctx.clients.status(c) not in gone
            and c not in secure.withdrawn
            and not ctx.clients.is_silent(c, now, timeout)
        }
        left = [c for c in self._buffer.members if c not in keep]
        job.secure_attempt += 1
        self._buffer = SecureBuffer(
            self._buffer.size, ctx.config.job.max_staleness, self._staleness, keep
        )
        self._stages = None
        for cid, version in list(self._waiting.items()):
            if self._buffer.full:
                break
            del self._waiting[cid]
            if ctx.clients.is_silent(cid, now, timeout):
                self._ready_task.pop(cid, None)
                continue
            try:
                self._buffer.ready(cid, version, job.model_version)
            except StaleTaskError:  # too stale by now: it trains again
                self._ready_task.pop(cid, None)
        for cid in left:
            self._ready_task.pop(cid, None)
        with ctx.store.transaction() as tx:
            tx.delete_secure_state(job.round)
            for cid, m in self._buffer.members.items():
                ctx.set_status(cid, Participant.SELECTED, 0, _ready_row(m.version, m.tau), tx=tx)
            for cid in left:
                ctx.set_status(cid, Participant.DROPPED, tx=tx)
            tx.set_job(job)
        log_event(
            ctx.log,
            "secure_buffer_retried",
            logging.WARNING,
            round=job.round,
            attempt=job.secure_attempt,
            of=self._retries,
            kept=sorted(keep),
            reason=reason,
        )
        ctx.notify()

    def _form(self, now: float) -> None:
        ctx = self._ctx
        self._setup.form(self._buffer, now)
        self._stages = self._secure_fit()
        with ctx.store.transaction() as tx:
            self._stages.save(tx)
        log_event(
            ctx.log,
            "secure_buffer_formed",
            round=ctx.job.round,
            members=sorted(self._buffer.members),
        )
        ctx.notify()

    def close(self) -> FitResult:
        if self._stages is None:  # cannot happen: tick closes only a formed round
            raise AggregationError("the secure buffer's round was never formed")
        result = self._stages.close()
        _, contributors = self._buffer.result()
        info = {
            **result.info,
            "in_flight": len(self._training.assigned),
            "mean_staleness": self._buffer.mean_staleness(contributors),
        }
        return FitResult(result.delta, None, info)

    def save(self, tx: Any) -> None:
        self._training.save(tx)
        if self._stages is not None:
            self._stages.save(tx)

    def checkpoint(self) -> None:
        pass  # `save` holds it, inside the store

    def stage(self) -> str | None:
        if self._stages is not None:
            return self._stages.stage()
        return None


def staleness_of(ctx: JobContext) -> Staleness:
    """The job's staleness weight (strategies/staleness.py)."""
    job = ctx.config.job
    return make_staleness(job.staleness, job.staleness_options)


def _ready_row(version: int, tau: int) -> dict[str, float]:
    """A ready member's participant row: its version, and its staleness when it joined."""
    return {VERSION_KEY: float(version), STALENESS_KEY: float(tau), "deadline": 0.0}
