"""The secure-aggregation stage transitions of the round loop.

A secure fit phase moves through the SecureRound's stages: each closes when its
answers are in or its deadline passes, clients it finds misbehaving are excluded by
name, a failed run is retried with a fresh cohort, and once the sum is unmasked the
contributors are marked accepted. RoundLoop (round_loop.py) mixes these in.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sporenet.federated.secagg import SecAggError, Stage
from sporenet.federated.server.config import SecureConfig, ServerConfig
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phases import Participant, Phase
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.state import JobState, Store


class SecureStages:
    """Closing, excluding and retrying the stages of a secure round (state from RoundLoop)."""

    config: ServerConfig
    metrics: Metrics
    log: logging.Logger
    store: Store
    clients: Participants
    job: JobState
    wake: threading.Event
    _changed: threading.Condition
    _secure: SecurePhase | None
    _since_checkpoint: int

    if TYPE_CHECKING:

        def _fail_job(self, reason: str) -> None: ...

        def _notify_changed(self) -> None: ...

        def _set_status(
            self,
            client_id: str,
            status: Participant,
            num_samples: int = 0,
            metrics: dict[str, Any] | None = None,
            *,
            tx: Any = None,
        ) -> None: ...

    @property
    def _secure_settings(self) -> SecureConfig:
        """`[secure_aggregation]` (its defaults for a secure round restored from the store)."""
        return self.config.secure_aggregation or SecureConfig()

    def _stage_timeout(self) -> float:
        stage_timeout = self._secure_settings.stage_timeout
        if self._secure is None:
            return stage_timeout
        return self._secure.stage_timeout(
            round_timeout=self.config.round_timeout, stage_timeout=stage_timeout
        )

    def _save_secure(self, tx: Any) -> None:
        """Persist the open SecureRound (inside the caller's transaction)."""
        if self._secure is not None:
            tx.set_secure_state(self.job.round, self._secure.round.to_bytes())
        self._since_checkpoint = 0

    def _advance_secure(self, now: float, secure: SecurePhase) -> bool:
        """Close the secure stage when it may close; True once the round has its sum."""
        job = self.job
        if secure.stage == Stage.COMPLETED:  # restarted between the last stage and publishing
            return True
        if not secure.may_close(now, self.clients, self.config.heartbeat_timeout):
            return False
        pending, closing = secure.round.pending(), secure.stage.value
        try:
            secure.round.close_stage()
        except SecAggError as e:
            self.metrics.inc("sporenet_rounds_failed_total")
            if job.secure_attempt < self._secure_settings.retries:
                self._retry_secure(now, e)
                return False
            with self.store.transaction() as tx:
                self._save_secure(tx)
            self._fail_job(f"round {job.round}: secure aggregation failed: {e}")
            return False
        secure.deadline = now + self._stage_timeout()
        excluded = secure.newly_excluded()  # e.g. inconsistent shares found at unmask
        with self.store.transaction() as tx:
            self._save_secure(tx)
            for cid in pending:
                if self.clients.status(cid) in (Participant.SELECTED, Participant.MASKED):
                    self._set_status(cid, Participant.DROPPED, tx=tx)
        if pending:
            self.metrics.inc("sporenet_clients_dropped_total", len(pending))
        log_event(
            self.log,
            "secure_stage_closed",
            round=job.round,
            stage=closing,
            next=secure.stage.value,
            missing=pending,
        )
        if excluded:
            self._exclude_secure(secure, excluded)
        self._notify_changed()
        return secure.stage == Stage.COMPLETED

    def _exclude_secure(self, secure: SecurePhase, excluded: dict[str, str]) -> None:
        """Clients the secure round excluded for misbehaving: saved, marked, logged by
        name; the loop is woken if nobody else is awaited (call it under the lock)."""
        secure.newly_excluded()  # these are reported here
        with self.store.transaction() as tx:
            self._save_secure(tx)
            for cid in excluded:
                self._set_status(cid, Participant.EXCLUDED, tx=tx)
        for cid, reason in excluded.items():
            self.metrics.inc("sporenet_clients_excluded_total")
            log_event(
                self.log,
                "secure_client_excluded",
                logging.WARNING,
                round=self.job.round,
                stage=secure.stage.value,
                client=cid,
                reason=reason,
            )
        if not secure.round.pending():
            self.wake.set()

    def _retry_secure(self, now: float, error: SecAggError) -> None:
        """Give up this run of the secure round (nothing of it can be unmasked) and go back
        to waiting: the next tick samples a new cohort from the clients then live."""
        job = self.job
        job.secure_attempt += 1
        job.active, job.attempt, job.waiting_since = False, 0, now
        left = [c for c in self.clients.selected() if self.clients.status(c) != Participant.DROPPED]
        self._secure = None
        with self.store.transaction() as tx:
            for cid in left:
                tx.set_participant(job.round, Phase.FIT, cid, Participant.ABANDONED)
            tx.set_job(job)
        self.clients.end_phase()
        log_event(
            self.log,
            "secure_round_retried",
            logging.WARNING,
            round=job.round,
            attempt=job.secure_attempt,
            of=self._secure_settings.retries,
            reason=str(error),
        )
        self._notify_changed()

    def _mark_contributors(self, secure: SecurePhase, contributors: Sequence[str]) -> None:
        """After a secure round: contributors are accepted, the rest of the cohort dropped."""
        rows = self.store.participants(self.job.round, Phase.FIT)
        done, excluded = set(contributors), secure.round.excluded()
        with self._changed, self.store.transaction() as tx:
            for cid in secure.cohort:
                _, n, m = rows.get(cid, ("", 0, {}))
                status = Participant.ACCEPTED if cid in done else Participant.DROPPED
                if cid in excluded and cid not in done:
                    status = Participant.EXCLUDED
                self._set_status(cid, status, n, m, tx=tx)
