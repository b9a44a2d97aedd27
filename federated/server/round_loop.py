"""The round state machine's transitions: what `tick()` does as time passes and answers arrive.

A phase is first *waiting* (fewer live clients than it needs), then *active*: `tick`
starts it (sampling the clients), drops the selected clients that fell silent, selects
replacements when a fit phase is short of updates, closes secure stages, and finally
aggregates and publishes the next model version (or summarises an evaluate phase) and
moves the job on. Every transition is one store transaction.

RoundLoop holds the transitions and the helpers they share with the client-facing calls
(the secure stages' own transitions are in secure_stages.py);
RoundManager (rounds.py) builds the state and adds those calls on top.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.federated.aggregation import Aggregator, Template, Weights
from sporenet.federated.errors import AggregationError
from sporenet.federated.privacy import PrivacyError
from sporenet.federated.secagg import SecAggError
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.ledger import PrivacyLedger
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phase_files import PhaseFiles, file_key
from sporenet.federated.server.phases import JobStatus, Participant, Phase
from sporenet.federated.server.publication import Publication, PublishOnce
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.secure_stages import SecureStages
from sporenet.federated.server.state import JobState, ModelRecord, Store
from sporenet.federated.strategies.base import Strategy
from sporenet.lite import WeightsReader, replace_weights_bytes

Clock = Callable[[], float]


def weighted_metrics(rows: Sequence[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """Sample-weighted mean of each metric over the clients that reported it."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for n, metrics in rows:
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + n * v
            weights[k] = weights.get(k, 0.0) + n
    return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}


class RoundLoop(SecureStages):
    """The transitions of the job's rounds (RoundManager builds the state they act on)."""

    config: ServerConfig
    metrics: Metrics
    log: logging.Logger
    clock: Clock
    strategy: Strategy
    dir: Path
    store: Store
    models: ModelStore
    clients: Participants
    privacy: PrivacyLedger
    job: JobState
    wake: threading.Event
    _lock: threading.RLock
    _changed: threading.Condition
    _change_listeners: list[Callable[[], None]]
    _aggregator: Aggregator | None
    _secure: SecurePhase | None
    _with_parts: set[str]
    _phase_files: tuple[tuple[int, str], PhaseFiles] | None
    _aggregating: bool
    _publication: PublishOnce
    _stopping: bool
    _since_checkpoint: int
    _phase_t0: float
    _template: Template
    _weights: Weights
    _weights_reader: WeightsReader
    _model_bytes: bytes
    _model_record: ModelRecord
    _opt_state: dict[str, np.ndarray]

    # -- shared with the client-facing calls ----------------------------------------------

    def _wake_if_settled(self) -> None:
        """Wake the round loop once no selected client is left to report (call it under
        the lock): only then can an arrival close the phase early; deadlines and dropouts
        it checks on its own ticks."""
        if not self.clients.waiting():
            self.wake.set()

    def _notify_changed(self) -> None:
        self._changed.notify_all()
        for listener in self._change_listeners:
            listener()

    def _files(self) -> PhaseFiles:
        """The open phase's files (made once per phase: every update asks)."""
        files = self._phase_files
        key = (self.job.round, self.job.phase)
        if files is None or files[0] != key:
            files = self._phase_files = (key, PhaseFiles(self.dir, *key))
        return files[1]

    def _make_aggregator(self) -> Aggregator:
        return self.privacy.make_aggregator(self.strategy, self._template, self.job.dp_cohort)

    def _save_job(self) -> None:
        with self.store.transaction() as tx:
            tx.set_job(self.job)

    def _set_status(
        self,
        client_id: str,
        status: Participant,
        num_samples: int = 0,
        metrics: dict[str, Any] | None = None,
        *,
        tx: Any = None,
    ) -> None:
        """Change a participant's status in memory and in the store (in `tx`, if given)."""
        self.clients.set(client_id, status)
        job = self.job
        if tx is not None:
            tx.set_participant(job.round, job.phase, client_id, status, num_samples, metrics)
            return
        with self.store.transaction() as own:
            own.set_participant(job.round, job.phase, client_id, status, num_samples, metrics)

    def note_part(self, client_id: str) -> None:
        """Note that an upload of the client keeps a `.part` file (see _clear_uploads)."""
        self._with_parts.add(client_id)

    def has_part(self, client_id: str) -> bool:
        """Whether an upload of the client may have kept a `.part` file since the start."""
        return client_id in self._with_parts

    def _clear_uploads(self, client_id: str | None = None) -> None:
        """Delete partial uploads (`.part`): a client's once its update is in, everyone's
        when the phase closes (they belong to its task) and at start. Only a client
        noted by `note_part` has any to look for: most updates arrive in one go."""
        if client_id is not None:
            if client_id not in self._with_parts:
                return
            self._with_parts.discard(client_id)
            pattern = f"{file_key(client_id)}-*.part"
        else:
            self._with_parts.clear()
            pattern = "*.part"
        for part in (self.dir / "uploads").glob(pattern):
            part.unlink(missing_ok=True)

    def _fail_job(self, reason: str) -> None:
        """End the job as failed (call it under the lock)."""
        self._publication.release()
        self._clear_uploads()
        self.job.status, self.job.reason, self.job.active = JobStatus.FAILED, reason, False
        self._save_job()
        log_event(self.log, "job_failed", logging.ERROR, reason=reason)
        self._notify_changed()

    def _task_id(self) -> str:
        """The open phase's task id; a secure round run again gets a new one, so clients
        start fresh secure sessions instead of answering with the failed run's keys."""
        return f"r{self.job.round}-{self.job.phase}{self._secure_run()}"

    def _secure_run(self) -> str:
        """Names a run of a secure round after its first (the task id, the cohort's seed)."""
        return f"-s{self.job.secure_attempt}" if self.job.secure_attempt else ""

    def _live_clients(self, now: float) -> list[str]:
        return self.clients.live(now, self.config.heartbeat_timeout)

    # -- transitions ---------------------------------------------------------------------

    def tick(self) -> None:
        """Advance the state machine by whatever time and arrivals allow (called ~10×/s).

        A publication that failed (say the disk is full) is held and tried again here,
        from the step that failed (publication.py); its phase takes no answers meanwhile.
        """
        now = self.clock()
        with self._changed:
            job = self.job
            if job.status != JobStatus.RUNNING or self._stopping:
                return
            if self._aggregating:
                if not self._publication.pending:
                    return  # a close runs on another thread
            elif not job.active:
                self._try_start(now)
                return
            elif self._secure is not None:
                if not self._advance_secure(now, self._secure):
                    return
            elif not self._phase_may_close(now):
                return
            self._aggregating = True
            self._notify_changed()
        # Aggregation and publishing run outside the lock: heartbeats and polls keep flowing.
        try:
            if self.job.phase == Phase.FIT:
                self._publish_fit()
            else:
                self._finish_evaluate()
        finally:
            with self._changed:
                self._aggregating = self._publication.pending
                self._notify_changed()

    def _phase_may_close(self, now: float) -> bool:
        """Whether the open plain phase closes now (selecting replacements when a fit phase
        has too few updates to close)."""
        self._drop_silent(now)
        pending = self.clients.count(Participant.SELECTED)
        accepted = self.clients.count(Participant.ACCEPTED)
        settled = pending == 0 or now >= self.job.deadline
        if self.job.phase == Phase.EVALUATE:
            return settled
        if accepted >= self.config.min_clients and settled:
            return True
        if settled:
            self._reselect(now, accepted, pending)
        return False

    def _drop_silent(self, now: float) -> None:
        timeout = self.config.heartbeat_timeout
        dropped = [
            c
            for c in self.clients.with_status(Participant.SELECTED)
            if self.clients.is_silent(c, now, timeout)
        ]
        if not dropped:
            return
        with self.store.transaction() as tx:
            for cid in dropped:
                self._set_status(cid, Participant.DROPPED, tx=tx)
        self.metrics.inc("sporenet_clients_dropped_total", len(dropped))
        log_event(
            self.log, "clients_dropped", logging.WARNING, round=self.job.round, clients=dropped
        )

    def _try_start(self, now: float) -> None:
        job, config = self.job, self.config
        live = self._live_clients(now)
        fit = job.phase == Phase.FIT
        need = max(config.min_clients, config.min_available) if fit else 1
        if len(live) < need:
            if config.wait_timeout and now - job.waiting_since > config.wait_timeout:
                self._fail_job(
                    f"only {len(live)} of min_clients={need} clients connected within "
                    f"wait_timeout={config.wait_timeout:g} s"
                )
            return
        # A fraction of the live clients, at least min_clients: min_available only says when
        # a round may start, not how many it asks (DP's sampling rate is this cohort's share).
        fraction = config.fraction if fit else config.evaluate_fraction
        least = config.min_clients if fit else 1
        size = min(len(live), max(least, math.ceil(fraction * len(live))))
        if fit and self.privacy.enabled:
            rate = self.privacy.charged_rate(size / len(live))
            why = self.privacy.budget_left(rate)
            if why:
                self._finish_for_budget(why)
                return
            job.dp_cohort, job.dp_sample_rate = size, rate
        rng = random.Random(f"{config.seed}-{job.round}-{job.phase}{self._secure_run()}")
        chosen = sorted(rng.sample(live, size))
        job.active, job.attempt = True, 0
        job.fruitless, job.accepted_at_deadline = 0, 0
        job.phase_started, job.deadline = now, now + config.round_timeout
        self.clients.start_phase(chosen)
        self._since_checkpoint = 0
        self._phase_t0 = self.clock()
        self._secure = None
        if fit and config.secure_aggregation is not None:
            try:
                self._secure = SecurePhase(
                    SecureRound.start(
                        config.secure_aggregation.protocol,
                        client_ids=chosen,
                        template=self._template,
                        max_weight=config.secure_aggregation.max_weight,
                    )
                )
            except SecAggError as e:
                self._fail_job(f"round {job.round}: secure aggregation cannot start: {e}")
                return
            self._secure.deadline = now + self._stage_timeout()
        elif fit:
            self._aggregator = self._make_aggregator()
        with self.store.transaction() as tx:
            tx.start_round(job.round, job.phase)
            for cid in chosen:
                tx.set_participant(job.round, job.phase, cid, Participant.SELECTED)
            self._save_secure(tx)  # the round and its secure state start together
            tx.set_job(job)
        self.metrics.set("sporenet_round_participants", len(chosen))
        log_event(
            self.log,
            "phase_started",
            round=job.round,
            phase=job.phase,
            selected=len(chosen),
            live=len(live),
        )
        self._notify_changed()

    def _reselect(self, now: float, accepted: int, pending: int) -> None:
        """Too few updates: select replacements (and, past the deadline, extend it)."""
        job = self.job
        missing = self.config.min_clients - accepted - pending
        asked = set(self.clients.selected())
        spare = [c for c in self._live_clients(now) if c not in asked]
        rng = random.Random(f"{self.config.seed}-{job.round}-{job.attempt}")
        extra = sorted(rng.sample(spare, min(len(spare), max(missing, 0))))
        if now >= job.deadline:
            if job.attempt and accepted <= job.accepted_at_deadline:
                job.fruitless += 1  # the last reselection brought no update
            else:
                job.fruitless = 0
            job.accepted_at_deadline = accepted
            if job.fruitless >= self.config.max_fruitless_reselections:
                self._fail_job(self._fruitless_reason(accepted))
                return
            job.attempt += 1
            job.deadline = now + self.config.round_timeout
        elif not extra:
            return  # nobody to ask yet; the deadline decides
        with self.store.transaction() as tx:
            for cid in extra:
                self._set_status(cid, Participant.SELECTED, tx=tx)
            tx.set_job(job)
        log_event(
            self.log,
            "phase_reselected",
            logging.WARNING,
            round=job.round,
            accepted=accepted,
            added=len(extra),
            attempt=job.attempt,
        )
        self._notify_changed()

    def _fruitless_reason(self, accepted: int) -> str:
        """Why a fit phase gives up: the updates it has, and what became of the others."""
        job, config = self.job, self.config
        refused = self.clients.with_status(Participant.REJECTED)
        dropped = self.clients.with_status(Participant.DROPPED)
        parts = [
            f"round {job.round}: only {accepted} of min_clients={config.min_clients} updates"
            f" accepted, and {job.fruitless} reselection(s) in a row brought no new update"
            f" (max_fruitless_reselections={config.max_fruitless_reselections})"
        ]
        if refused:
            why = "; ".join(f"{c!r}: {self.clients.refusal(c)}" for c in refused[:5])
            more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
            parts.append(f"every update refused from {why}{more}")
        if dropped:
            parts.append(f"dropped out: {dropped[:5]}" + (" ..." if len(dropped) > 5 else ""))
        return "; ".join(parts)

    def _finish_for_budget(self, why: str) -> None:
        """End the job cleanly (finished, not failed): the next round would overspend."""
        job = self.job
        job.status, job.reason, job.active = JobStatus.FINISHED, why, False
        self._save_job()
        log_event(self.log, "job_finished", reason=why, model_version=job.model_version)
        self._notify_changed()

    def _aggregate(self) -> tuple[Weights, float | None, dict[str, Any]]:
        """The closed fit phase's mean delta, the clipping norm it used (central DP), and
        what the log says about a secure round."""
        if self._secure is not None:
            delta, contributors = self._secure.round.result()
            server_result = self._secure.round.server.result()
            self._mark_contributors(self._secure, contributors)
            return (
                delta,
                None,
                {
                    "secure_error_bound": server_result.error_bound,
                    "out_of_range": server_result.out_of_range,
                    "excluded": self._secure.round.excluded(),
                },
            )
        if self._aggregator is None:  # cannot happen: set whenever a fit phase is active
            raise AggregationError("no aggregator for the fit phase")
        # Read before result(): adaptive clipping moves the norm for the next round.
        clip = getattr(self._aggregator, "clipping_norm", None)
        return self._aggregator.result(), clip, {}

    def _publish_fit(self) -> None:
        """Aggregate the closed fit phase and publish the next model version: prepared
        once (the noise drawn, the optimizer run, the privacy charge worked out), then
        written and recorded, retried from the failed step until it is durable."""
        job, t0 = self.job, self.clock()
        publication = self._publication.held(self._task_id())
        if publication is None:
            publication = self._prepare_publication()
            if publication is None:
                return
        try:
            record = self._record_publication(publication)
        except Exception:
            publication.failures += 1
            raise
        self._publication.release()
        files = self._files()
        files.remove()
        # Only now that the store names `version`: a restart before this resumed from the last.
        removed = self.models.prune(record.version, self.config.keep_models)
        took = self.clock() - t0
        self.metrics.inc("sporenet_rounds_completed_total")
        self.metrics.set("sporenet_aggregation_seconds", took)
        self.metrics.set("sporenet_round_duration_seconds", self.clock() - self._phase_t0)
        self.metrics.set("sporenet_current_round", job.round)
        privacy_info = publication.privacy_info
        log_event(
            self.log,
            "round_published",
            round=record.round,
            version=record.version,
            clients=publication.clients,
            aggregation_s=round(took, 4),
            metrics=publication.summary,
            models_removed=removed,
            failed_attempts=publication.failures,
            **publication.secure_info,
            **privacy_info,
        )
        if publication.all_rounds_done:  # (a budget stop logged its own job_finished)
            self._log_if_finished()

    def _prepare_publication(self) -> Publication | None:
        """The closed phase's model, computed once (None: the job failed instead)."""
        job = self.job
        try:
            delta, clip, secure_info = self._aggregate()
            new_weights, new_state = self.strategy.apply(self._weights, delta, self._opt_state)
            del delta  # large models: hold at most the sums, the new weights and their bytes
            charged = self.privacy.charged(
                job.round,
                sample_rate=job.dp_sample_rate,
                cohort=job.dp_cohort,
                clipping_norm=clip,
            )
        except (AggregationError, SecAggError, PrivacyError) as e:
            with self._changed:
                self._fail_job(f"round {job.round}: {e}")
            return None
        data = replace_weights_bytes(self._model_bytes, new_weights)
        del new_weights  # they are in `data` now: hold them once
        privacy_info = {}
        if charged is not None and charged.accountant is not None:
            privacy_info = {"epsilon": charged.epsilon(), "delta": charged.accountant.delta}
        rows = self.store.participants(job.round, Phase.FIT)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        summary = weighted_metrics(accepted)
        summary["num_samples"] = float(sum(n for n, _ in accepted))
        return self._publication.hold(
            Publication(
                self._task_id(),
                data,
                new_state,
                secure_info,
                charged=charged,
                privacy_info=privacy_info,
                clients=len(accepted),
                summary=summary,
                sample_rate=job.dp_sample_rate,
            )
        )

    def _record_publication(self, publication: Publication) -> ModelRecord:
        """Write the model (once) and record it, its round and what it spent in one
        transaction; the ledger takes the charge only once that has committed."""
        job = self.job
        version = job.model_version + 1
        if publication.record is None:
            self.models.write_moments(version, publication.moments)
            publication.record = self.models.write(version, job.round, publication.data)
        record = publication.record
        with self._changed:
            with self._job_transaction() as tx:
                tx.add_model(record)
                tx.finish_round(job.round, Phase.FIT, publication.clients, publication.summary)
                tx.delete_secure_state(job.round)
                if publication.charged is not None:  # what this round spent, with its round
                    tx.set_meta("privacy", publication.charged.state())
                job.model_version = version
                every = self.config.evaluate_every
                self._advance(tx, evaluate_next=bool(every) and job.round % every == 0)
            if publication.charged is not None:
                self.privacy.commit(publication.charged)
                # Logged before any client can see the round's end (under the lock).
                self._log_privacy_spent(
                    record.round, publication.sample_rate, publication.privacy_info
                )
            self._end_phase()
            publication.all_rounds_done = job.status == JobStatus.FINISHED
            # Stop now if even the smallest sampling rate a round can have is unaffordable.
            # (After an evaluate phase, the next fit phase's start checks instead.)
            if job.status == JobStatus.RUNNING and job.phase == Phase.FIT:
                why = self.privacy.budget_left(self.privacy.charged_rate(self.config.fraction))
                if why:
                    self._finish_for_budget(why)
            self._model_bytes, self._opt_state = publication.data, publication.moments
            self._weights = self._weights_reader.read(publication.data)
            self._model_record = record
            self._aggregator = None
            self._secure = None
        return record

    @contextlib.contextmanager
    def _job_transaction(self) -> Iterator[Any]:
        """A store transaction that also changes `self.job`: if it does not commit, the
        job in memory is put back as it was, so a retry starts from what the store holds."""
        before = dataclasses.replace(self.job)
        try:
            with self.store.transaction() as tx:
                yield tx
        except BaseException:
            for f in dataclasses.fields(before):
                setattr(self.job, f.name, getattr(before, f.name))
            raise

    def _log_privacy_spent(self, round_: int, sample_rate: float, info: dict[str, Any]) -> None:
        acc = self.privacy.accountant
        self.metrics.set("sporenet_privacy_epsilon", info["epsilon"])
        log_event(
            self.log,
            "privacy_spent",
            round=round_,
            epsilon=info["epsilon"],
            delta=info["delta"],
            sample_rate=sample_rate,
            budget=acc.epsilon_budget if acc is not None else None,
        )

    def _finish_evaluate(self) -> None:
        job = self.job
        round_ = job.round  # _advance moves the job to the next round
        rows = self.store.participants(round_, Phase.EVALUATE)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        summary = weighted_metrics(accepted)
        with self._changed:
            with self._job_transaction() as tx:
                tx.finish_round(round_, Phase.EVALUATE, len(accepted), summary)
                self._advance(tx, evaluate_next=False)
            self._end_phase()
        log_event(
            self.log, "evaluation_finished", round=round_, clients=len(accepted), metrics=summary
        )
        self._log_if_finished()

    def _advance(self, tx: Any, *, evaluate_next: bool) -> None:
        """Move the job past the phase that just closed (inside the caller's transaction;
        `_end_phase` once it has committed)."""
        job = self.job
        if evaluate_next:
            job.phase = Phase.EVALUATE
        elif job.round >= self.config.rounds:  # the job ends at its last round and phase
            job.status = JobStatus.FINISHED
            job.reason = f"all {self.config.rounds} rounds done"
        else:
            job.phase = Phase.FIT
            job.round += 1
        job.active, job.attempt, job.waiting_since = False, 0, self.clock()
        job.fruitless, job.accepted_at_deadline = 0, 0
        job.secure_attempt = 0
        tx.set_job(job)

    def _end_phase(self) -> None:
        """After the transaction that moved the job on: the phase's statuses and partial
        uploads go (call it under the lock)."""
        self.clients.end_phase()
        self._clear_uploads()

    def _log_if_finished(self) -> None:
        """Log `job_finished` once the job is done (after the last phase's own event)."""
        job = self.job
        if job.status == JobStatus.FINISHED:
            log_event(
                self.log, "job_finished", rounds=self.config.rounds, model_version=job.model_version
            )
