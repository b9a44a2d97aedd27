"""The secure fit phase: one SecAgg+ round among the cohort (secagg/session.py).

The cohort is fixed when the phase starts. It moves through the SecureRound's stages,
each a TASK_SECURE_FIT task answered with SubmitSecure: a stage closes when its answers
are in or its deadline passes (secure_phase.py), clients it finds misbehaving are
excluded by name, a failed run goes back to waiting for a fresh cohort (up to
`secure_aggregation.retries` times) and then fails the job; once the sum is unmasked the
contributors are marked accepted. The SecureRound is saved with every transition, so
a restart resumes the stage in progress.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sporenet.federated.errors import AggregationError, StaleTaskError, quote
from sporenet.federated.secagg import ClientExcludedError, SecAggError, Stage
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server.cohort_task import CohortTask
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.open_phase import (
    Answer,
    FitResult,
    SecureMessage,
    Tick,
    TickResult,
    Withdrawal,
)
from sporenet.federated.server.phases import Participant, Phase, TaskInfo
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.secure_setup import SecureSetup


class SecureFit:
    """A fit phase whose server learns only the sum of the cohort's masked updates."""

    kind = Phase.FIT

    def __init__(
        self,
        setup: SecureSetup,
        secure: SecurePhase | None = None,
        *,
        state: Callable[[], bytes] | None = None,
    ) -> None:
        self._setup = setup
        self._ctx = setup.ctx
        self._cohort = CohortTask(setup.ctx)
        # What `save` persists: the round's bytes, or its owner's (a secure buffer's).
        self._state = state
        self._settings = setup.settings  # its defaults for a round restored from the store
        self._secure = secure  # set by `start`, or restored
        self._since_save = 0

    @classmethod
    def restored(cls, setup: SecureSetup, saved: bytes) -> SecureFit:
        """The secure round a restart found in the store, its stage given `resume_grace`."""
        phase = cls(setup, SecurePhase(SecureRound.from_bytes(saved)))
        setup.resume(phase._round(), "secure_round_restored")
        return phase

    def _round(self) -> SecurePhase:
        if self._secure is None:  # cannot happen: the manager starts a phase before use
            raise AggregationError("the secure phase was not started")
        return self._secure

    def start(self, now: float, cohort: list[str]) -> None:
        self._secure = self._setup.start(cohort, now)

    # -- the cohort's calls ------------------------------------------------------------

    def task(self, client_id: str) -> TaskInfo | None:
        """A secure stage for a cohort member the protocol waits for; otherwise wait."""
        return self._setup.task(self._round(), client_id)

    def owns(self, client_id: str, task_id: str) -> bool:
        return self._cohort.owns(task_id)

    def answered(self, client_id: str, task_id: str) -> bool:
        return self._cohort.answered(client_id, task_id)

    def wants(self, client_id: str, task_id: str) -> bool:
        return self._round().wants(client_id)

    def accepts(self, client_id: str, answer: type[Answer]) -> None:
        task_id = self._ctx.machine.task_id()
        if answer is Withdrawal:
            if client_id not in self._round().cohort:
                raise StaleTaskError(f"task {quote(task_id)} is not an open secure round")
            return
        if answer is not SecureMessage:
            raise StaleTaskError(
                f"round {quote(task_id)} is a secure round: plain updates are refused (the"
                " client answers TASK_SECURE_FIT stages with SubmitSecure)"
            )

    def submit(self, client_id: str, answer: Answer) -> None:
        """Record one client message of the open stage (a resent one is a no-op), or a
        withdrawal.

        Raises:
            StaleTaskError: the stage is closed, or the client is not asked for it.
            SecAggError: the message is malformed.
        """
        ctx, secure = self._ctx, self._round()
        if isinstance(answer, Withdrawal):
            secure.withdrawn.add(client_id)
            ctx.wake.set()
            return
        if not isinstance(answer, SecureMessage):
            raise StaleTaskError("a secure fit phase takes secure messages only")
        if not secure.check_message(client_id, answer.stage, ctx.machine.task_id()):
            return
        try:
            secure.round.submit(client_id, answer.payload)
        except ClientExcludedError as e:
            self._exclude(secure, {client_id: e.reason})
            raise
        if secure.stage == Stage.MASKED_INPUT:
            ctx.set_status(client_id, Participant.MASKED, answer.num_samples, answer.metrics)
            ctx.metrics.inc("sporenet_updates_accepted_total")
        self._since_save += 1
        if self._since_save >= ctx.config.checkpoint_every:
            with ctx.store.transaction() as tx:
                self.save(tx)
        if not secure.round.pending():
            ctx.wake.set()  # the round loop can close the stage now

    # -- the round loop's ----------------------------------------------------------------

    def tick(self, now: float) -> TickResult:
        """Close the open stage when it may close; CLOSE once the round has its sum."""
        ctx, secure = self._ctx, self._round()
        job = ctx.job
        if secure.stage == Stage.COMPLETED:  # restarted between the last stage and publishing
            return TickResult(Tick.CLOSE)
        if not secure.may_close(now, ctx.clients, ctx.config.heartbeat_timeout):
            return TickResult(Tick.OPEN)
        pending, closing = secure.round.pending(), secure.stage.value
        try:
            secure.round.close_stage()
        except SecAggError as e:
            ctx.metrics.inc("sporenet_rounds_failed_total")
            if job.secure_attempt < self._settings.retries:
                self._retry(now, e)
                return TickResult(Tick.RETRY)
            with ctx.store.transaction() as tx:
                self.save(tx)
            return TickResult(Tick.FAIL, f"round {job.round}: secure aggregation failed: {e}")
        secure.deadline = now + self._setup.stage_timeout(secure)
        excluded = secure.newly_excluded()  # e.g. inconsistent shares found at unmask
        with ctx.store.transaction() as tx:
            self.save(tx)
            for cid in pending:
                if ctx.clients.status(cid) in (Participant.SELECTED, Participant.MASKED):
                    ctx.set_status(cid, Participant.DROPPED, tx=tx)
        if pending:
            ctx.metrics.inc("sporenet_clients_dropped_total", len(pending))
        log_event(
            ctx.log,
            "secure_stage_closed",
            round=job.round,
            stage=closing,
            next=secure.stage.value,
            missing=pending,
        )
        if excluded:
            self._exclude(secure, excluded)
        ctx.notify()
        return TickResult(Tick.CLOSE if secure.stage == Stage.COMPLETED else Tick.OPEN)

    def _exclude(self, secure: SecurePhase, excluded: dict[str, str]) -> None:
        """Clients the secure round excluded for misbehaving: saved, marked, logged by
        name; the loop is woken if nobody else is awaited (call it under the lock)."""
        ctx = self._ctx
        secure.newly_excluded()  # these are reported here
        with ctx.store.transaction() as tx:
            self.save(tx)
            for cid in excluded:
                ctx.set_status(cid, Participant.EXCLUDED, tx=tx)
        for cid, reason in excluded.items():
            ctx.metrics.inc("sporenet_clients_excluded_total")
            log_event(
                ctx.log,
                "secure_client_excluded",
                logging.WARNING,
                round=ctx.job.round,
                stage=secure.stage.value,
                client=cid,
                reason=reason,
            )
        if not secure.round.pending():
            ctx.wake.set()

    def _retry(self, now: float, error: SecAggError) -> None:
        """Give up this run of the secure round (nothing of it can be unmasked) and go back
        to waiting: the next tick samples a new cohort from the clients then live."""
        ctx = self._ctx
        job = ctx.job
        left = [c for c in ctx.clients.selected() if ctx.clients.status(c) != Participant.DROPPED]
        ctx.machine.retry(now)
        with ctx.store.transaction() as tx:
            for cid in left:
                tx.set_participant(job.round, Phase.FIT, cid, Participant.ABANDONED)
            tx.set_job(job)
        log_event(
            ctx.log,
            "secure_round_retried",
            logging.WARNING,
            round=job.round,
            attempt=job.secure_attempt,
            of=self._settings.retries,
            reason=str(error),
        )

    def close(self) -> FitResult:
        """The unmasked mean; contributors are marked accepted, the rest of the cohort
        dropped (or excluded)."""
        ctx, secure = self._ctx, self._round()
        delta, contributors = secure.round.result()
        server_result = secure.round.server.result()
        rows = ctx.store.participants(ctx.job.round, Phase.FIT)
        done, excluded = set(contributors), secure.round.excluded()
        with ctx.changed, ctx.store.transaction() as tx:
            for cid in secure.cohort:
                _, n, m = rows.get(cid, ("", 0, {}))
                status = Participant.ACCEPTED if cid in done else Participant.DROPPED
                if cid in excluded and cid not in done:
                    status = Participant.EXCLUDED
                ctx.set_status(cid, status, n, m, tx=tx)
        info = {
            "secure_error_bound": server_result.error_bound,
            "out_of_range": server_result.out_of_range,
            "excluded": secure.round.excluded(),
        }
        return FitResult(delta, None, info)

    def save(self, tx: Any) -> None:
        """Persist the open SecureRound (inside the caller's transaction)."""
        if self._secure is not None:
            saved = self._state() if self._state is not None else self._secure.round.to_bytes()
            tx.set_secure_state(self._ctx.job.round, saved)
        self._since_save = 0

    def checkpoint(self) -> None:
        pass  # `save` holds it, inside the store

    def follow(self, tx: Any) -> None:
        return None  # the job waits for enough live clients to start the next phase

    def enter(self) -> None:
        pass

    def stage(self) -> str | None:
        return self._secure.stage.value if self._secure is not None else None
