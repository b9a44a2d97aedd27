"""The round state machine: who trains what, when a phase closes, and publishing its model.

A job runs `rounds` rounds. Each round has a fit phase and, every `evaluate_every` rounds,
an evaluate phase. A phase is first *waiting* (not enough live clients yet), then *active*:
a sample of live clients is selected, they download the model and upload updates, which
are validated and folded into the phase's aggregator as they arrive. The phase closes
when every selected client has answered (accepted, refused or dropped out) or at its
deadline; a fit phase with fewer than `min_clients` accepted updates selects replacements
instead of closing. Closing aggregates, applies the strategy and publishes the next model
version.

With `[secure_aggregation]`, a fit phase holds a SecurePhase (SecAgg+) instead of an
aggregator: the cohort is fixed when the phase starts, and each protocol stage closes as
secure_phase.py says. Fewer than `threshold` survivors run the round again with a new
cohort (up to `secure_aggregation.retries` times) and then fail the job.

The collaborators, one file each: `Participants` (liveness and the phase's statuses),
`ModelStore` (model versions), `PhaseFiles` (kept updates and aggregate checkpoints),
`PrivacyLedger` (differential privacy), `SecurePhase`, and the SQLite `Store`, written in
one transaction per transition, so a restart continues where the job stopped. Time comes
from the injected `clock`; the transports (servicer.py, session.py) call the public
methods and map their exceptions to status codes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sporenet.federated.aggregation import Aggregator
from sporenet.federated.common.codec import decode_update
from sporenet.federated.errors import (
    AggregationError,
    HierarchyError,
    StaleTaskError,
    UnknownClientError,
    UpdateRejectedError,
    quote,
)
from sporenet.federated.server import (
    hierarchy,
    job_security,
    job_settings,
    restore,
    secure_calls,
    state_dir,
)
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.ledger import PrivacyLedger
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phase_files import PhaseFiles, file_key
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.publication import PublishOnce
from sporenet.federated.server.round_loop import Clock, RoundLoop, weighted_metrics
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.state import ModelRecord
from sporenet.federated.server.status import config_summary
from sporenet.federated.server.validation import parse_metrics, validate_update
from sporenet.federated.strategies import make_strategy
from sporenet.lite import WeightsReader

MAX_REFUSALS = 3  # a client whose update is refused this often sits out the rest of the phase


class RoundManager(RoundLoop):
    """The job's rounds; every public method is thread-safe."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics,
        logger: logging.Logger,
        clock: Clock = time.time,
    ) -> None:
        """Open the job in `config.state_dir`: resume it, or start it from `config.model`.

        Args:
            config: the daemon's settings.
            metrics: where counters and gauges go (the /metrics endpoint).
            logger: where the JSON events go.
            clock: seconds since the epoch; deadlines are saved in this time.

        Raises:
            ConfigError: the state dir and the settings do not make a runnable job.
        """
        self.config, self.metrics, self.log, self.clock = config, metrics, logger, clock
        self.strategy = make_strategy(config.strategy.name, config.strategy.options)
        self.dir = Path(config.state_dir)
        state_dir.prepare(self.dir)
        self._dir_lock = state_dir.StateDirLock(self.dir)  # one daemon per state dir
        try:
            self._open_job(config, clock)
        except BaseException:  # a refused start gives the state dir back
            if hasattr(self, "store"):
                self.store.close()
            self._dir_lock.close()
            raise

    def _open_job(self, config: ServerConfig, clock: Clock) -> None:
        """Resume the job in the state dir, or start it (the constructor, once locked)."""
        self.store = state_dir.open_store(self.dir)
        self._with_parts: set[str] = set()  # clients whose uploads may have kept a .part
        self._phase_files: tuple[tuple[int, str], PhaseFiles] | None = None
        self._clear_uploads()  # a restart's clients upload again from byte 0
        self.models = ModelStore(self.dir)
        self.clients = Participants()
        # The published model's weights, as read-only views of its bytes: each round's
        # model differs from the last only in them, so it is parsed once.
        # Only trainable tensors are federated (all float constants when none is flagged):
        # the others (input scaling, frozen statistics) stay as the initial model has them.
        self._weights_reader = WeightsReader(trainable_only=True)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._decode_slots = threading.BoundedSemaphore(2)  # bounds decode memory, not clients
        self._stopping = False
        self._aggregating = False
        self._publication = PublishOnce()  # a closed phase's model until it is durable
        # Set when an arrival may let the round loop act (start or close a phase) before
        # its next periodic tick. Polls are woken only by phase changes: waking every
        # poller on every update costs O(clients²) per round.
        self.wake = threading.Event()
        # Called (under the lock) whenever tasks may have changed: how the asyncio
        # sessions learn of it.
        self._change_listeners: list[Callable[[], None]] = []
        self._aggregator: Aggregator | None = None
        self._secure: SecurePhase | None = None  # the open secure fit phase, if any
        self._since_checkpoint = 0
        # (aggregator, how many of its clients' kept updates are dropped, the last of them)
        self._phase_t0 = clock()
        # Once the job has ended: the clients told so (with its final model), and since when.
        self._told_done: set[str] = set()
        self._ended_at: float | None = None

        now = clock()
        job = self.store.job()
        self.privacy = PrivacyLedger(
            config.differential_privacy,
            self.store.get_meta("privacy"),
            resumed_round=job.round if job is not None else None,
        )
        if job is None:
            job = restore.init_job(self, now)
        else:
            # The CLI merged the stored settings already; callers of the API may not.
            job_settings.check_resumed(self.store, config)
            kept = job_security.kept(
                self.store.get_meta(job_security.META_KEY), self.store.get_meta("config")
            )
            job_security.check_kept(kept, config)
            log_event(self.log, "job_resumed", round=job.round, phase=job.phase, status=job.status)
            if self.privacy.enabled:
                self.metrics.set("sporenet_privacy_epsilon", self.privacy.epsilon())
                rounds = self.privacy.accountant.rounds if self.privacy.accountant else 0
                log_event(
                    self.log, "privacy_restored", rounds=rounds, epsilon=self.privacy.epsilon()
                )
        self.job = job
        with self.store.transaction() as tx:
            tx.set_meta("config", config_summary(config))
            tx.set_meta(job_security.META_KEY, job_security.security_table(config))
        restore.load_model(self, job.model_version)
        restore.check_old_models(self)
        self.privacy.check_distributed_range(
            config.secure_aggregation.protocol if config.secure_aggregation else None,
            config.min_clients,
            self._template,
        )
        # After a restart every known client gets `resume_grace` to come back before it
        # counts as silent (it may be waiting out a backoff while the daemon starts).
        seen = now + max(config.resume_grace - config.heartbeat_timeout, 0.0)
        for cid in self.store.clients():
            self.clients.seen(cid, seen)
        if job.status == JobStatus.RUNNING and job.active:
            restore.resume_phase(self, now)
        self.metrics.set("sporenet_current_round", job.round)
        self.metrics.set("sporenet_clients_registered", len(self.clients))

    # -- setup ----------------------------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (quick, never blocking) whenever clients' tasks may have changed."""
        with self._lock:
            self._change_listeners.append(listener)

    def on_left(self, listener: Callable[[str, Participant], None]) -> None:
        """Call `listener(client_id, status)` (quick, never blocking) when a client the open
        phase awaited stops being awaited: answered, dropped, refused or excluded."""
        with self._lock:
            self.clients.on_leave(listener)

    def upload_wanted(self, client_id: str, task_id: str) -> bool:
        """Whether an update of `client_id` for `task_id` may still be folded (the fit
        task open, the client awaited): an upload that is not loses its slot."""
        with self._lock:
            try:
                self._check_open(client_id, task_id, Phase.FIT)
            except StaleTaskError:
                return False
            return True

    @property
    def stopping(self) -> bool:
        """True once `stop()` was called: held polls should answer now."""
        return self._stopping

    # -- client-facing --------------------------------------------------------------------

    def register(self, name: str, identity: str | None, info: dict[str, str]) -> str:
        """The client's id: its authenticated identity, else its chosen name, else a new one.

        Raises:
            HierarchyError: an edge aggregator asked to join a job that cannot take one.
        """
        client_id = identity or name or f"client-{os.urandom(6).hex()}"
        if hierarchy.is_edge(info):
            why = hierarchy.edge_refusal(self.config)
            if why:
                log_event(self.log, "edge_refused", logging.WARNING, client=client_id, reason=why)
                raise HierarchyError(f"edge {quote(client_id)} refused: {why}")
        with self._changed:
            new = client_id not in self.clients
            with self.store.transaction() as tx:
                tx.add_client(client_id, name or client_id, info)
            self.clients.seen(client_id, self.clock())
            self.metrics.set("sporenet_clients_registered", len(self.clients))
            self.wake.set()  # pollers' tasks are unchanged; the round loop may act
        if new:
            log_event(self.log, "client_registered", client=client_id)
        return client_id

    def touch(self, client_id: str) -> None:
        """Mark the client alive; raises UnknownClientError for ids never registered."""
        with self._lock:
            if client_id not in self.clients:
                raise UnknownClientError(
                    f"client {quote(client_id)} is not registered; call Register first"
                )
            self.clients.seen(client_id, self.clock())

    def _task_config(self) -> dict[str, Any]:
        job = self.job
        config = {"round": job.round, "rounds": self.config.rounds, **self.config.fit_config}
        if job.phase == Phase.FIT:
            config.update(self.strategy.fit_config(job.round))
        return config

    def _current_task(self, client_id: str) -> TaskInfo:
        job = self.job
        if job.status != JobStatus.RUNNING:
            # The SDK raises JobFailedError with the reason when the job failed.
            return TaskInfo(
                TaskType.DONE,
                job.round,
                model=self._model_record,
                config={"job_status": job.status.value},
                reason=job.reason or job.status,
            )
        if job.active and not self._aggregating and self._secure is not None:
            return secure_calls.secure_task(self, client_id, self._secure)
        if (
            job.active
            and not self._aggregating
            and self.clients.status(client_id) == Participant.SELECTED
        ):
            config = self._task_config()
            if job.phase == Phase.FIT:
                config.update(self.privacy.task_config())
            return TaskInfo(
                TaskType(job.phase), job.round, self._task_id(), self._model_record, config
            )
        reason = "not selected" if job.active else "waiting"
        return TaskInfo(TaskType.WAIT, job.round, retry_after=1.0, reason=reason)

    def get_task(self, client_id: str) -> TaskInfo:
        """The client's task now (the Session service holds a poll until it changes).

        Raises:
            UnknownClientError: the client never registered.
        """
        self.touch(client_id)
        with self._lock:
            return self._current_task(client_id)

    def heartbeat(self, client_id: str, task_id: str) -> bool:
        """Mark alive; True while `task_id` is still wanted from this client."""
        self.touch(client_id)
        with self._lock:
            job = self.job
            if job.status != JobStatus.RUNNING or task_id != self._task_id():
                return False
            if self._secure is not None:
                return self._secure.wants(client_id)
            return (
                job.active
                and not self._aggregating
                and self.clients.status(client_id) == Participant.SELECTED
            )

    def model_record(self, version: int) -> ModelRecord:
        """The record of a published model version (StaleTaskError if there is none)."""
        record = self.store.model(version)
        if record is None:
            raise StaleTaskError(
                f"model version {version} does not exist (latest is {self.job.model_version})"
            )
        if version != self.job.model_version and not self.models.path(record).exists():
            raise StaleTaskError(
                f"model version {version} was deleted (storage.keep_models ="
                f" {self.config.keep_models}); the latest is {self.job.model_version}"
            )
        return record

    def model_path(self, record: ModelRecord) -> Path:
        return self.models.path(record)

    def upload_path(self, client_id: str, upload_id: str) -> Path:
        """Where an interrupted upload keeps what it received."""
        return self.dir / "uploads" / f"{file_key(client_id)}-{upload_id}.part"

    def open_upload(self, client_id: str, task_id: str, total_size: int) -> bool:
        """Check an upload may start; False when this task's update was already accepted.

        Raises:
            StaleTaskError: the task is not open for this client.
            UpdateRejectedError: the update is larger than `max_update_bytes`.
        """
        self.touch(client_id)
        with self._lock:
            accepted = self.clients.status(client_id) == Participant.ACCEPTED
            if task_id == self._task_id() and self.job.phase == Phase.FIT and accepted:
                return False
            self._check_open(client_id, task_id, Phase.FIT)
        if total_size > self.max_update_bytes:
            self.refuse(
                client_id,
                UpdateRejectedError(
                    f"update is {total_size} bytes; at most {self.max_update_bytes} are accepted "
                    "(max_update_bytes)"
                ),
            )
        return True

    def _check_open(self, client_id: str, task_id: str, phase: Phase) -> None:
        current, job = self._task_id(), self.job
        if (
            job.status != JobStatus.RUNNING
            or task_id != current
            or not job.active
            or job.phase != phase
        ):
            raise StaleTaskError(
                f"task {quote(task_id)} is not open (the server is at {current!r}, {job.status})"
            )
        if self._aggregating:
            raise StaleTaskError(f"task {quote(task_id)} closed: the round is being aggregated")
        if self._secure is not None:
            raise StaleTaskError(
                f"round {quote(task_id)} is a secure round: plain updates are refused (the client"
                " answers TASK_SECURE_FIT stages with SubmitSecure)"
            )
        status = self.clients.status(client_id)
        if status != Participant.SELECTED:
            raise StaleTaskError(
                f"client {quote(client_id)} has no open task in {current!r} (status {status})"
            )

    def refuse(self, client_id: str, error: UpdateRejectedError) -> None:
        """Count a refused update against the client, then raise `error`."""
        self.metrics.inc("sporenet_updates_rejected_total")
        with self._changed:
            count = self.clients.refused(client_id, str(error))
            if count >= MAX_REFUSALS and self.clients.status(client_id) == Participant.SELECTED:
                self._set_status(client_id, Participant.REJECTED)
                self._wake_if_settled()
        log_event(
            self.log,
            "update_refused",
            logging.WARNING,
            client=client_id,
            reason=str(error),
            count=count,
        )
        raise error

    def submit_update(
        self,
        client_id: str,
        task_id: str,
        payload: memoryview,
        *,
        upload: Path | None,
        mismatch: str,
        num_samples: int,
        metrics_json: str,
        crc: int | None = None,
    ) -> None:
        """Validate a completely received update and fold it into the aggregate.

        Args:
            client_id: the sender.
            task_id: the task the update answers.
            payload: the update's bytes; the decoded tensors are views of them.
            upload: the path of its partial file, if one was kept (removed once used).
            mismatch: why the bytes do not match the upload header's checksum ('' when
                they do: see checksum.update_mismatch).
            num_samples: the sample count that weighs the update.
            metrics_json: the client's training metrics.
            crc: the payload's CRC-32 if already known (the upload header's, matched), so
                the kept copy's trailer does not compute it again.

        Raises:
            UpdateRejectedError: the update is malformed or out of bounds.
            StaleTaskError: the task closed meanwhile.

        Before the update counts, its bytes are appended to the phase's journal, so an
        accepted update survives a `kill -9` until the next checkpoint contains it.
        """
        # The slot is held until the update is folded: at most two decoded updates exist at
        # any time, however many clients upload at once (memory flat in the fleet size).
        with self._decode_slots:
            try:
                metrics = parse_metrics(metrics_json, "metrics_json")
                if mismatch:
                    raise UpdateRejectedError(mismatch)
                update = decode_update(payload, self._template)
                norm = validate_update(
                    update, num_samples=num_samples, max_norm=self.config.max_update_norm
                )
            except UpdateRejectedError as e:
                if upload is not None:
                    upload.unlink(missing_ok=True)
                self.refuse(client_id, e)
            try:
                with self._changed:
                    self._check_open(client_id, task_id, Phase.FIT)
                    if self._aggregator is None:  # cannot happen while a fit phase is open
                        raise AggregationError("no aggregator for the open fit phase")
                    # Journalled first (under the lock, so a checkpoint never empties the
                    # journal between an update's record and its fold), then folded.
                    self._files().append(client_id, payload, crc)
                    self._aggregator.add(client_id, update, float(num_samples))
                    self._set_status(client_id, Participant.ACCEPTED, num_samples, metrics)
                    self._since_checkpoint += 1
                    if self._since_checkpoint >= self.config.checkpoint_every:
                        self._checkpoint()
                    self.metrics.inc("sporenet_updates_accepted_total")
                    self._wake_if_settled()
            finally:
                del update
        if upload is not None:
            upload.unlink(missing_ok=True)
        self._clear_uploads(client_id)  # earlier, abandoned uploads of this update
        # Per update: debug only (each round logs its counts; /metrics counts updates).
        log_event(
            self.log,
            "update_accepted",
            logging.DEBUG,
            client=client_id,
            task=task_id,
            samples=num_samples,
            norm=norm,
        )

    def _checkpoint(self) -> None:
        """Save the aggregate, which empties the phase's journal (PhaseFiles.checkpoint)."""
        if self._aggregator is not None:
            self._files().checkpoint(self._aggregator)
        self._since_checkpoint = 0

    def report_evaluation(
        self, client_id: str, task_id: str, *, loss: float, num_samples: int, metrics_json: str
    ) -> None:
        """Record one evaluation result.

        Raises:
            UpdateRejectedError: a non-finite loss, no samples or malformed metrics.
            StaleTaskError: no evaluate task is open for this client.
        """
        self.touch(client_id)
        metrics = parse_metrics(metrics_json, "metrics_json")
        if not math.isfinite(loss) or num_samples <= 0:
            raise UpdateRejectedError(
                f"evaluation needs a finite loss and num_samples > 0, got {loss}, {num_samples}"
            )
        with self._changed:
            self._check_open(client_id, task_id, Phase.EVALUATE)
            self._set_status(
                client_id, Participant.ACCEPTED, num_samples, {"loss": loss, **metrics}
            )
            self._wake_if_settled()

    def submit_secure(
        self,
        client_id: str,
        task_id: str,
        stage: str,
        payload: bytes,
        *,
        num_samples: int = 0,
        metrics_json: str = "",
    ) -> None:
        """Record one client message of the open secure stage (secure_calls.py)."""
        secure_calls.submit_secure(
            self,
            client_id,
            task_id,
            stage,
            payload,
            num_samples=num_samples,
            metrics_json=metrics_json,
        )

    def withdraw_secure(self, client_id: str, task_id: str) -> None:
        """The client cannot continue the secure round (secure_calls.py)."""
        secure_calls.withdraw_secure(self, client_id, task_id)

    def status(self) -> dict[str, Any]:
        """The job as the running daemon sees it (`GetStatus`)."""
        with self._lock:
            return {
                "job": dataclasses.asdict(self.job),
                "participants": self.clients.counts(),
                "clients_registered": len(self.clients),
                "clients_live": len(self._live_clients(self.clock())),
                "aggregating": self._aggregating,
                "secure_stage": self._secure.stage.value if self._secure is not None else None,
                "rounds": self.store.rounds(),
                "privacy": self.store.get_meta("privacy"),
            }

    def told_done(self, client_id: str, record: ModelRecord | None) -> None:
        """Note that the client received the ended job's DONE task and its final model
        (`record` None: it holds it already)."""
        with self._lock:
            job = self.job
            if job.status != JobStatus.RUNNING and (
                record is None or record.version == job.model_version
            ):
                self._told_done.add(client_id)

    def ended_and_told(self) -> bool:
        """True once the job has ended and every live client was told, or none of them
        asked for `heartbeat_timeout` seconds since (a client that stops calling is gone):
        then the daemon may exit."""
        now = self.clock()
        with self._lock:
            if self.job.status == JobStatus.RUNNING or self._aggregating:
                return False
            if self._ended_at is None:
                self._ended_at = now
            if now - self._ended_at >= self.config.heartbeat_timeout:
                return True
            return all(c in self._told_done for c in self._live_clients(now))

    # -- shutdown --------------------------------------------------------------------------

    def stop(self) -> None:
        """Wake every held poll so in-flight calls can finish; persists the job."""
        with self._changed:
            self._stopping = True
            self._notify_changed()
            try:
                self._checkpoint()
                with self.store.transaction() as tx:
                    self._save_secure(tx)
                self._save_job()
            except (OSError, sqlite3.Error, AggregationError) as e:
                # A full disk must not turn SIGTERM into a crash: what was persisted before
                # stays, and a restart resumes from it.
                log_event(self.log, "stop_persist_failed", logging.ERROR, error=str(e))

    def close(self) -> None:
        if self._phase_files is not None:
            self._phase_files[1].close()
        self.store.close()
        self._dir_lock.close()


__all__ = ["RoundManager", "TaskInfo", "weighted_metrics"]
