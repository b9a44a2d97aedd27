"""The round manager: one job's rounds, behind the calls the transports make.

A job runs `rounds` rounds. Each round has a fit phase and, every `evaluate_every` rounds,
an evaluate phase. What the job does next is the pure `RoundMachine` (machine.py); the
open phase is an `OpenPhase` (open_phase.py: plain fit, secure fit or evaluate), and
what a closed phase becomes is the tier's `Publisher` (publisher.py: the cloud publishes
a model version; an edge keeps a partial aggregate for the cloud, edge/rounds.py). This
class composes them: it holds the lock, persists each transition in one store
transaction (so a restart continues where the job stopped), validates updates, and
answers the transports (servicer.py, session.py), which map its exceptions to status
codes. Time comes from the injected `clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from sporenet.federated.common.codec import decode_update
from sporenet.federated.errors import (
    AggregationError,
    HierarchyError,
    StaleTaskError,
    TransferError,
    UnknownClientError,
    UpdateRejectedError,
    quote,
)
from sporenet.federated.server import hierarchy, job_security, job_settings, restore, state_dir
from sporenet.federated.server.async_fit import AsyncFit
from sporenet.federated.server.config import SecureConfig, ServerConfig
from sporenet.federated.server.current_model import CurrentModel
from sporenet.federated.server.evaluate import EvaluatePhase
from sporenet.federated.server.group_commit import COMMIT_DELAY
from sporenet.federated.server.job_context import Clock, JobContext, PartialUploads
from sporenet.federated.server.ledger import PrivacyLedger
from sporenet.federated.server.machine import RoundMachine, Rules, Wait
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.open_phase import (
    Answer,
    Evaluation,
    OpenPhase,
    SecureMessage,
    Tick,
    Update,
    Withdrawal,
)
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.plain_fit import PlainFit
from sporenet.federated.server.publisher import (
    CloudPublisher,
    Publisher,
    finish_for_budget,
    weighted_metrics,
)
from sporenet.federated.server.secure_async_fit import SecureAsyncFit
from sporenet.federated.server.secure_fit import SecureFit
from sporenet.federated.server.secure_setup import SecureSetup
from sporenet.federated.server.state import JobState, ModelRecord, Store
from sporenet.federated.server.status import config_summary
from sporenet.federated.server.validation import parse_metrics, validate_update
from sporenet.federated.strategies import make_strategy


class BeingAggregatedError(StaleTaskError):
    """The task's phase is being aggregated: the answer is too late for it, though an async
    job's next buffer may still take it once the publication ends."""


MAX_REFUSALS = 3  # a client whose update is refused this often sits out the rest of the phase

#: Builds the tier's publisher for a job (the cloud's by default).
PublisherFor = Callable[[JobContext], Publisher]

#: The phase kind each answer belongs to.
_ANSWER_PHASE: dict[type, Phase] = {
    Update: Phase.FIT,
    SecureMessage: Phase.FIT,
    Withdrawal: Phase.FIT,
    Evaluation: Phase.EVALUATE,
}


class RoundManager:
    """The job's rounds; every public method is thread-safe."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics,
        logger: logging.Logger,
        clock: Clock = time.time,
        publisher: PublisherFor = CloudPublisher,
        reselect_when_short: bool = True,
    ) -> None:
        """Open the job in `config.state_dir`: resume it, or start it from `config.model`.

        Args:
            config: the daemon's settings.
            metrics: where counters and gauges go (the /metrics endpoint).
            logger: where the JSON events go.
            clock: seconds since the epoch; deadlines are saved in this time.
            publisher: the tier's publisher, built with the job's context.
            reselect_when_short: whether a fit phase short of min_clients at its deadline
                asks replacements (the cloud) or gives up (an edge).

        Raises:
            ConfigError: the state dir and the settings do not make a runnable job.
        """
        self.config, self.metrics, self.log, self.clock = config, metrics, logger, clock
        self.dir = Path(config.state_dir)
        state_dir.prepare(self.dir)
        self._dir_lock = state_dir.StateDirLock(self.dir)  # one daemon per state dir
        store = None
        try:
            store = state_dir.open_store(self.dir)
            self.context = self._open_job(config, store, publisher, reselect_when_short)
        except BaseException:  # a refused start gives the state dir back
            if store is not None:
                store.close()
            self._dir_lock.close()
            raise
        ctx = self.context
        self.store, self.models, self.clients = ctx.store, ctx.models, ctx.clients
        self.privacy, self.strategy, self.wake = ctx.privacy, ctx.strategy, ctx.wake
        self._decode_slots = threading.BoundedSemaphore(2)  # bounds decode memory, not clients
        self._stopping = False
        self._aggregating = False
        # Once the job has ended: the clients told so (with its final model), and since when.
        self._told_done: set[str] = set()
        self._ended_at: float | None = None

    def _open_job(
        self, config: ServerConfig, store: Store, publisher: PublisherFor, reselect: bool
    ) -> JobContext:
        """Resume the job in the state dir, or start it (the constructor, once locked)."""
        uploads = PartialUploads(self.dir)
        uploads.clear()  # a restart's clients upload again from byte 0
        models = ModelStore(self.dir)
        now = self.clock()
        job = store.job()
        privacy = PrivacyLedger(
            config.differential_privacy,
            store.get_meta("privacy"),
            resumed_round=job.round if job is not None else None,
        )
        if job is None:
            job = restore.new_job(store, models, config, privacy, self.log, now)
        else:
            # The CLI merged the stored settings already; callers of the API may not.
            job_settings.check_resumed(store, config)
            kept = job_security.kept(
                store.get_meta(job_security.META_KEY), store.get_meta("config")
            )
            job_security.check_kept(kept, config)
            log_event(self.log, "job_resumed", round=job.round, phase=job.phase, status=job.status)
            if privacy.enabled:
                self.metrics.set("sporenet_privacy_epsilon", privacy.epsilon())
                rounds = privacy.accountant.rounds if privacy.accountant else 0
                log_event(self.log, "privacy_restored", rounds=rounds, epsilon=privacy.epsilon())
        with store.transaction() as tx:
            tx.set_meta("config", config_summary(config))
            tx.set_meta(job_security.META_KEY, job_security.security_table(config))
        model = CurrentModel(models, config.max_update_bytes)
        model.load(store, job.model_version)
        restore.check_old_models(store, models, job.model_version, self.log)
        privacy.check_distributed_range(
            config.secure_aggregation.protocol if config.secure_aggregation else None,
            config.min_clients,
            model.template,
        )
        clients = Participants()
        ctx = JobContext(
            config=config,
            metrics=self.metrics,
            log=self.log,
            clock=self.clock,
            dir=self.dir,
            store=store,
            models=models,
            model=model,
            clients=clients,
            privacy=privacy,
            strategy=make_strategy(config.strategy.name, config.strategy.options),
            machine=RoundMachine(job, clients, Rules.of(config, reselect_when_short=reselect)),
            uploads=uploads,
        )
        self._publisher = publisher(ctx)
        # After a restart every known client gets `resume_grace` to come back before it
        # counts as silent (it may be waiting out a backoff while the daemon starts).
        seen = now + max(config.resume_grace - config.heartbeat_timeout, 0.0)
        for cid in store.clients():
            clients.seen(cid, seen)
        found = restore.resumed(store, job, ctx.dir)
        if found is not None:
            self._resume_phase(ctx, found, now)
        self.metrics.set("sporenet_current_round", job.round)
        self.metrics.set("sporenet_clients_registered", len(clients))
        return ctx

    def _resume_phase(self, ctx: JobContext, found: restore.Resumed, now: float) -> None:
        """Rebuild the active phase after a restart: participants, aggregate, deadline."""
        job = ctx.job
        ctx.clients.restore_phase({cid: status for cid, (status, _, _) in found.rows.items()})
        task_config = self._publisher.task_config()
        if ctx.config.job.is_async and ctx.config.secure_aggregation is not None:
            setup = SecureSetup(ctx, task_config, ctx.config.secure_aggregation)
            ctx.phase = SecureAsyncFit.restored(setup, found.rows, found.secure_state)
        elif ctx.config.job.is_async:
            ctx.phase = AsyncFit.restored(ctx, task_config, found.rows)
        elif found.secure_state is not None:
            settings = ctx.config.secure_aggregation or SecureConfig()
            ctx.phase = SecureFit.restored(
                SecureSetup(ctx, task_config, settings), found.secure_state
            )
        elif job.phase == Phase.FIT:
            plain = PlainFit(ctx, task_config)
            plain.restore(found.rows)
            ctx.phase = plain
        else:
            ctx.phase = EvaluatePhase(ctx, task_config)
        job.deadline = max(job.deadline, now + ctx.config.resume_grace)
        ctx.save_job()

    def _new_phase(self, ctx: JobContext) -> OpenPhase:
        """The phase about to start: evaluate, or plain or secure fit by the settings."""
        task_config = self._publisher.task_config()
        if ctx.job.phase == Phase.EVALUATE:
            return EvaluatePhase(ctx, task_config)
        sa = ctx.config.secure_aggregation
        if ctx.config.job.is_async and sa is not None:
            return SecureAsyncFit(SecureSetup(ctx, task_config, sa))
        if ctx.config.job.is_async:
            return AsyncFit(ctx, task_config)
        if sa is not None:
            return SecureFit(SecureSetup(ctx, task_config, sa))
        return PlainFit(ctx, task_config)

    # -- what the other parts of the job read ----------------------------------------------

    @property
    def job(self) -> JobState:
        return self.context.machine.job

    @property
    def model(self) -> CurrentModel:
        """The current model version, its weights and template."""
        return self.context.model

    @property
    def update_bytes(self) -> int:
        return self.context.model.update_bytes

    @property
    def max_update_bytes(self) -> int:
        return self.context.model.max_update_bytes

    @property
    def publisher(self) -> Publisher:
        return self._publisher

    @property
    def aggregating(self) -> bool:
        """True while a closed phase is aggregated or its publication retried."""
        return self._aggregating

    @contextlib.contextmanager
    def settled(self) -> Iterator[JobContext]:
        """The job's context under the lock, once no close is running (for a publisher
        acting on its own, such as an edge starting the cloud's next task)."""
        ctx = self.context
        with ctx.changed:
            ctx.changed.wait_for(lambda: not self._aggregating)
            yield ctx

    # -- setup ----------------------------------------------------------------------------

    def on_change(self, listener: Callable[[Collection[str] | None], None]) -> None:
        """Call `listener(clients)` (quick, never blocking) whenever clients' tasks may have
        changed: those of `clients`, or anyone's when it is None."""
        with self.context.lock:
            self.context.listeners.append(listener)

    def on_left(self, listener: Callable[[str, Participant], None]) -> None:
        """Call `listener(client_id, status)` (quick, never blocking) when a client the open
        phase awaited stops being awaited: answered, dropped, refused or excluded."""
        with self.context.lock:
            self.clients.on_leave(listener)

    def upload_wanted(self, client_id: str, task_id: str) -> bool:
        """Whether an update of `client_id` for `task_id` may still be folded (the fit
        task open, the client awaited): an upload that is not loses its slot."""
        with self.context.lock:
            try:
                self._open_for(client_id, task_id, Update)
            except BeingAggregatedError:
                return True  # decided once the publication ends (an async job keeps it)
            except StaleTaskError:
                return False
            return True

    def may_give_work(self) -> bool:
        """Whether a task other than WAIT may be given now: a phase is open and not being
        aggregated, the job is over (DONE) or the server stops. While not, a change leaves
        every held poll's answer WAIT; each change that ends that state notifies."""
        ctx = self.context
        with ctx.lock:
            job = ctx.job
            if job.status != JobStatus.RUNNING or self._stopping:
                return True
            return job.active and not self._aggregating and ctx.phase is not None

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
        with self.context.changed:
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
        with self.context.lock:
            if client_id not in self.clients:
                raise UnknownClientError(
                    f"client {quote(client_id)} is not registered; call Register first"
                )
            self.clients.seen(client_id, self.clock())

    def _current_task(self, client_id: str) -> TaskInfo:
        ctx = self.context
        job = ctx.job
        if job.status != JobStatus.RUNNING:
            # The SDK raises JobFailedError with the reason when the job failed.
            return TaskInfo(
                TaskType.DONE,
                job.round,
                model=ctx.model.record,
                config={"job_status": job.status.value},
                reason=job.reason or job.status,
            )
        phase = ctx.phase
        if job.active and not self._aggregating and phase is not None:
            task = phase.task(client_id)
            if task is not None:
                return task
        reason = "not selected" if job.active else "waiting"
        return TaskInfo(TaskType.WAIT, job.round, retry_after=1.0, reason=reason)

    def get_task(self, client_id: str) -> TaskInfo:
        """The client's task now (the Session service holds a poll until it changes).

        Raises:
            UnknownClientError: the client never registered.
        """
        self.touch(client_id)
        with self.context.lock:
            return self._current_task(client_id)

    def heartbeat(self, client_id: str, task_id: str) -> bool:
        """Mark alive; True while `task_id` is still wanted from this client."""
        self.touch(client_id)
        ctx = self.context
        with ctx.lock:
            job, phase = ctx.job, ctx.phase
            if job.status != JobStatus.RUNNING or phase is None:
                return False
            if not job.active or self._aggregating or not phase.owns(client_id, task_id):
                return False
            return phase.wants(client_id, task_id)

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
                f" {self.config.models_kept}); the latest is {self.job.model_version}"
            )
        return record

    def model_path(self, record: ModelRecord) -> Path:
        return self.models.path(record)

    def upload_path(self, client_id: str, upload_id: str) -> Path:
        """Where an interrupted upload keeps what it received."""
        return self.context.uploads.path(client_id, upload_id)

    def note_part(self, client_id: str) -> None:
        """Note that an upload of the client keeps a `.part` file (cleared with its phase)."""
        self.context.uploads.note(client_id)

    def has_part(self, client_id: str) -> bool:
        """Whether an upload of the client may have kept a `.part` file since the start."""
        return self.context.uploads.has(client_id)

    def _open_for(self, client_id: str, task_id: str, answer: type[Answer]) -> OpenPhase:
        """The open phase, if an answer of type `answer` from the client to `task_id` may
        count now (call it under the lock).

        Raises:
            StaleTaskError: the task is closed, of another kind, or not the client's.
        """
        ctx = self.context
        job, phase, current = ctx.job, ctx.phase, ctx.machine.task_id()
        if (
            phase is None
            or not ctx.machine.is_running(_ANSWER_PHASE[answer])
            or not phase.owns(client_id, task_id)
        ):
            if answer in (SecureMessage, Withdrawal):
                why = f": {job.reason}" if job.status == JobStatus.FAILED else ""
                raise StaleTaskError(
                    f"task {quote(task_id)} is not an open secure round (the server is at "
                    f"{current!r}, {job.status}{why})"
                )
            raise StaleTaskError(
                f"task {quote(task_id)} is not open (the server is at {current!r}, {job.status})"
            )
        if self._aggregating and answer is not Withdrawal:
            raise BeingAggregatedError(
                f"task {quote(task_id)} closed: the round is being aggregated"
            )
        phase.accepts(client_id, answer)
        return phase

    def open_upload(self, client_id: str, task_id: str, total_size: int) -> bool:
        """Check an upload may start; False when this task's update was already accepted.

        Raises:
            StaleTaskError: the task is not open for this client.
            UpdateRejectedError: the update is larger than `max_update_bytes`.
        """
        self.touch(client_id)
        ctx = self.context
        with ctx.lock:
            phase = ctx.phase
            fit = ctx.job.phase == Phase.FIT and phase is not None
            if fit and phase is not None and phase.answered(client_id, task_id):
                return False
            self._open_for(client_id, task_id, Update)
        if total_size > self.max_update_bytes:
            self.refuse(
                client_id,
                UpdateRejectedError(
                    f"update is {total_size} bytes; at most {self.max_update_bytes} are accepted "
                    "(max_update_bytes)"
                ),
            )
        return True

    def refuse(self, client_id: str, error: UpdateRejectedError) -> None:
        """Count a refused update against the client, then raise `error`."""
        self.metrics.inc("sporenet_updates_rejected_total")
        ctx = self.context
        with ctx.changed:
            count = self.clients.refused(client_id, str(error))
            if count >= MAX_REFUSALS and self.clients.status(client_id) == Participant.SELECTED:
                ctx.set_status(client_id, Participant.REJECTED)
                ctx.wake_if_settled()
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

        The update is folded at once and counts once a checkpoint holds it: its upload
        is acknowledged only then (`committed`), so a `kill -9` before it loses nothing
        its client was told was accepted (the client sends it again).
        """
        # The slot is held until the update is folded: at most two decoded updates exist at
        # any time, however many clients upload at once (memory flat in the fleet size).
        with self._decode_slots:
            try:
                metrics = parse_metrics(metrics_json, "metrics_json")
                if mismatch:
                    raise UpdateRejectedError(mismatch)
                tensors = decode_update(payload, self.model.template)
                norm = validate_update(
                    tensors, num_samples=num_samples, max_norm=self.config.max_update_norm
                )
            except UpdateRejectedError as e:
                if upload is not None:
                    upload.unlink(missing_ok=True)
                self.refuse(client_id, e)
            answer = Update(tensors, num_samples, metrics, payload, crc)
            try:
                with self.context.changed:
                    self._open_for(client_id, task_id, Update).submit(client_id, answer)
            finally:
                del tensors, answer
        if upload is not None:
            upload.unlink(missing_ok=True)
        self.context.uploads.clear(client_id)  # earlier, abandoned uploads of this update
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

    def commit(self) -> None:
        """Checkpoint the open phase's folded updates now, a partial batch (what an
        acknowledgement that waited `COMMIT_DELAY` asks for)."""
        ctx = self.context
        with ctx.lock:
            if ctx.commits.pending == 0 or self._aggregating:
                return  # nothing waits, or the publication will hold them
            if ctx.phase is None:  # the job ended: the updates will never count
                ctx.commits.failed(StaleTaskError("the job ended before the update was saved"))
                return
            ctx.phase.checkpoint()

    async def committed(self, timeout: float, executor: Executor) -> None:
        """Wait until every update folded so far is durable (checkpointing a partial
        batch after `COMMIT_DELAY` on `executor`, off the event loop), at most `timeout`
        seconds.

        Raises:
            TransferError: they were still not durable after `timeout`.
            StaleTaskError: the job ended before they were.
            OSError, sqlite3.Error: their checkpoint failed (the client sends again).
        """
        commits, loop = self.context.commits, asyncio.get_running_loop()
        seq = commits.accepted
        end = time.monotonic() + timeout
        while not await commits.wait(seq, COMMIT_DELAY):
            if time.monotonic() > end:
                raise TransferError(
                    f"the update was folded but not saved within {timeout:g} s; send it again"
                )
            # The checkpoint writes files: off the event loop, as the folds that fill a batch.
            await loop.run_in_executor(executor, self.commit)

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
        with self.context.changed:
            phase = self._open_for(client_id, task_id, Evaluation)
            phase.submit(client_id, Evaluation(loss, num_samples, metrics))

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
        """Record one client message of the open secure stage (a resent one is a no-op).

        Raises:
            StaleTaskError: no secure round or stage is open for this client.
            SecAggError: the message is malformed.
        """
        self.touch(client_id)
        metrics = parse_metrics(metrics_json, "metrics_json")
        with self.context.changed:
            phase = self._open_for(client_id, task_id, SecureMessage)
            phase.submit(client_id, SecureMessage(stage, payload, num_samples, metrics))
        log_event(self.log, "secure_message", client=client_id, task=task_id, stage=stage)

    def withdraw_secure(self, client_id: str, task_id: str) -> None:
        """The client cannot continue the secure round: stop waiting for it."""
        self.touch(client_id)
        with self.context.changed:
            self._open_for(client_id, task_id, Withdrawal).submit(client_id, Withdrawal())
        log_event(self.log, "secure_withdrawn", logging.WARNING, client=client_id, task=task_id)

    def status(self) -> dict[str, Any]:
        """The job as the running daemon sees it (`GetStatus`)."""
        ctx = self.context
        with ctx.lock:
            return {
                "job": dataclasses.asdict(ctx.job),
                "participants": self.clients.counts(),
                "clients_registered": len(self.clients),
                "clients_live": len(ctx.machine.live(self.clock())),
                "aggregating": self._aggregating,
                "secure_stage": ctx.phase.stage() if ctx.phase is not None else None,
                "rounds": self.store.rounds(),
                "privacy": self.store.get_meta("privacy"),
            }

    def told_done(self, client_id: str, record: ModelRecord | None) -> None:
        """Note that the client received the ended job's DONE task and its final model
        (`record` None: it holds it already)."""
        with self.context.lock:
            job = self.job
            final = record is None or record.version == job.model_version
            if job.status != JobStatus.RUNNING and final and client_id not in self._told_done:
                self._told_done.add(client_id)
                self.context.notify()

    def told_every_client(self) -> bool:
        """Whether every registered client holds the ended job's final model (under the
        lock)."""
        return len(self._told_done) >= len(self.clients)

    def ended_and_told(self) -> bool:
        """True once the job has ended and every live client was told, or none of them
        asked for `heartbeat_timeout` seconds since (a client that stops calling is gone):
        then the daemon may exit."""
        now = self.clock()
        ctx = self.context
        with ctx.lock:
            if self.job.status == JobStatus.RUNNING or self._aggregating:
                return False
            if self._ended_at is None:
                self._ended_at = now
            if now - self._ended_at >= self.config.heartbeat_timeout:
                return True
            return all(c in self._told_done for c in ctx.machine.live(now))

    # -- the round loop -------------------------------------------------------------------

    def tick(self) -> None:
        """Advance the state machine by whatever time and arrivals allow (called ~10×/s).

        A publication that failed (say the disk is full) is held and tried again here,
        from the step that failed (publication.py); its phase takes no answers meanwhile.
        """
        now = self.clock()
        ctx = self.context
        with ctx.changed:
            job = ctx.job
            if job.status != JobStatus.RUNNING or self._stopping:
                return
            phase = ctx.phase
            if self._aggregating:
                if not self._publisher.pending:
                    return  # a close runs on another thread
            elif not job.active or phase is None:
                self._try_start(now)
                return
            else:
                result = phase.tick(now)
                if result.tick == Tick.FAIL:
                    self._publisher.fail(result.reason)
                    return
                if result.tick == Tick.RETRY:
                    ctx.phase = None
                    ctx.notify()
                    return
                if result.tick == Tick.OPEN:
                    return
            self._aggregating = True
            ctx.notify()
        # Aggregation and publishing run outside the lock: heartbeats and polls keep flowing.
        try:
            if ctx.phase is None:  # cannot happen: an aggregating phase stays until published
                raise AggregationError("no open phase to publish")
            if job.phase == Phase.FIT:
                self._publisher.publish_fit(ctx.phase)
            else:
                self._publisher.finish_evaluate()
        finally:
            with ctx.changed:
                self._aggregating = self._publisher.pending
                ctx.notify()

    def _try_start(self, now: float) -> None:
        """Start the waiting phase if enough clients are live (call it under the lock)."""
        ctx = self.context
        job, machine = ctx.job, ctx.machine
        if not self._publisher.may_start():
            return  # nothing to do until the tier has a phase to run
        plan = machine.plan_start(now)
        if isinstance(plan, Wait):
            if plan.fail:
                self._publisher.fail(plan.fail)
            return
        fit = job.phase == Phase.FIT
        if fit and self.privacy.enabled:
            rate = self.privacy.charged_rate(plan.rate)
            why = self.privacy.budget_left(rate)
            if why:
                finish_for_budget(ctx, why)
                return
            job.dp_cohort, job.dp_sample_rate = plan.size, rate
        chosen = machine.choose(plan)
        machine.start(now, chosen)
        phase = self._new_phase(ctx)
        try:
            phase.start(now, chosen)
        except AggregationError as e:
            self._publisher.fail(f"round {job.round}: {e}")
            return
        ctx.phase = phase
        with self.store.transaction() as tx:
            tx.start_round(job.round, job.phase)
            for cid in chosen:
                tx.set_participant(job.round, job.phase, cid, Participant.SELECTED)
            phase.save(tx)  # the round and its phase's state start together
            tx.set_job(job)
        self.metrics.set("sporenet_round_participants", len(chosen))
        log_event(
            self.log,
            "phase_started",
            round=job.round,
            phase=job.phase,
            selected=len(chosen),
            live=len(plan.live),
        )
        ctx.notify()

    # -- shutdown --------------------------------------------------------------------------

    def stop(self) -> None:
        """Wake every held poll so in-flight calls can finish; persists the job."""
        ctx = self.context
        with ctx.changed:
            self._stopping = True
            ctx.notify()
            try:
                phase = ctx.phase
                if phase is not None:
                    phase.checkpoint()
                    with self.store.transaction() as tx:
                        phase.save(tx)
                ctx.save_job()
            except (OSError, sqlite3.Error, AggregationError) as e:
                # A full disk must not turn SIGTERM into a crash: what was persisted before
                # stays, and a restart resumes from it.
                log_event(self.log, "stop_persist_failed", logging.ERROR, error=str(e))

    def close(self) -> None:
        self.context.close_files()
        self.store.close()
        self._dir_lock.close()


__all__ = ["MAX_REFUSALS", "BeingAggregatedError", "RoundManager", "TaskInfo", "weighted_metrics"]
