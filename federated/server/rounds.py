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
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sporenet.federated.aggregation import Aggregator, Weights, template_of
from sporenet.federated.common.codec import decode_update
from sporenet.federated.errors import (
    AggregationError,
    ConfigError,
    StaleTaskError,
    UnknownClientError,
    UpdateRejectedError,
)
from sporenet.federated.privacy import PrivacyError
from sporenet.federated.secagg import SecAggError, Stage
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server.config import SecureConfig, ServerConfig
from sporenet.federated.server.ledger import PrivacyLedger
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phase_files import PhaseFiles, file_key
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.state import JobState, ModelRecord, Store
from sporenet.federated.server.status import config_summary
from sporenet.federated.server.validation import parse_metrics, validate_update
from sporenet.federated.strategies import make_strategy
from sporenet.lite import ModelFormatError, WeightsReader, read_weights, replace_weights_bytes

MAX_REFUSALS = 3  # a client whose update is refused this often sits out the rest of the phase

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


class RoundManager:
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
        for sub in ("rounds", "uploads"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.store = Store(self.dir / "state.db")
        self.models = ModelStore(self.dir)
        self.clients = Participants()
        # The published model's weights, as read-only views of its bytes: each round's
        # model differs from the last only in them, so it is parsed once.
        self._weights_reader = WeightsReader()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._decode_slots = threading.BoundedSemaphore(2)  # bounds decode memory, not clients
        self._stopping = False
        self._aggregating = False
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
        self._phase_t0 = clock()

        now = clock()
        job = self.store.job()
        self.privacy = PrivacyLedger(
            config.differential_privacy,
            self.store.get_meta("privacy"),
            resumed_round=job.round if job is not None else None,
        )
        if job is None:
            job = self._init_job(now)
        else:
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
        self._load_model(job.model_version)
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
            self._resume_phase(now)
        self.metrics.set("sporenet_current_round", job.round)
        self.metrics.set("sporenet_clients_registered", len(self.clients))

    # -- setup ----------------------------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (quick, never blocking) whenever clients' tasks may have changed."""
        with self._lock:
            self._change_listeners.append(listener)

    @property
    def stopping(self) -> bool:
        """True once `stop()` was called: held polls should answer now."""
        return self._stopping

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

    def _init_job(self, now: float) -> JobState:
        model = self.config.model
        if model is None:
            raise ConfigError("`model` is required to start a new job (the state dir is empty)")
        try:
            data = Path(model).read_bytes()
        except OSError as e:
            raise ConfigError(f"`model`: cannot read {str(model)!r}: {e}") from None
        try:
            weights = read_weights(data)
        except ModelFormatError as e:
            raise ConfigError(f"`model` {str(model)!r} is not a valid .spore file: {e}") from None
        if not weights:
            raise ConfigError(f"`model` {str(model)!r} has no float weight tensors to train")
        record = self.models.write(0, 0, data)
        job = JobState(waiting_since=now)
        with self.store.transaction() as tx:
            tx.add_model(record)
            tx.set_job(job)
            if self.privacy.enabled:  # DP jobs have their accountant from the start
                tx.set_meta("privacy", self.privacy.state())
        log_event(self.log, "job_created", model=str(model), tensors=len(weights))
        return job

    def _load_model(self, version: int) -> None:
        record = self.store.model(version)
        if record is None:
            raise ConfigError(f"state dir {str(self.dir)!r} lost model version {version}")
        self._model_bytes = self.models.read(record)
        self._model_record = record
        # Views of the model's bytes: the weights are held once (strategies return new
        # arrays; an accidental write would raise instead of corrupting them).
        self._weights = self._weights_reader.read(self._model_bytes)
        self._template = template_of(self._weights)
        self.update_bytes = sum(a.nbytes for a in self._weights.values())  # a raw update's
        self.max_update_bytes = self.config.max_update_bytes or 2 * self.update_bytes + (1 << 20)
        self._opt_state = self.models.read_moments(version)

    def _files(self) -> PhaseFiles:
        return PhaseFiles(self.dir, self.job.round, self.job.phase)

    def _resume_phase(self, now: float) -> None:
        """Rebuild the active phase after a restart: participants, aggregate, deadline."""
        job = self.job
        rows = self.store.participants(job.round, job.phase)
        self.clients.restore_phase({cid: status for cid, (status, _, _) in rows.items()})
        secure = self.store.secure_state(job.round) if job.phase == Phase.FIT else None
        if secure is not None:
            self._secure = SecurePhase(SecureRound.from_bytes(secure))
            self._secure.deadline = now + max(self._stage_timeout(), self.config.resume_grace)
            log_event(
                self.log, "secure_round_restored", round=job.round, stage=self._secure.stage.value
            )
        elif job.phase == Phase.FIT:
            self._aggregator = agg = self._make_aggregator()
            files = self._files()
            files.restore(agg)
            folded, refolded = set(agg.clients), 0
            for cid, (status, n, _) in rows.items():
                if status != Participant.ACCEPTED or cid in folded:
                    continue
                kept = files.kept(cid)
                if kept.exists():
                    agg.add(cid, decode_update(kept.read_bytes(), self._template), float(n))
                    refolded += 1
                else:  # should not happen; ask the client for its update again
                    self._set_status(cid, Participant.SELECTED)
            log_event(self.log, "aggregate_restored", checkpointed=len(folded), refolded=refolded)
        job.deadline = max(job.deadline, now + self.config.resume_grace)
        self._save_job()

    def _make_aggregator(self) -> Aggregator:
        return self.privacy.make_aggregator(self.strategy, self._template, self.job.dp_cohort)

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

    def _fail_job(self, reason: str) -> None:
        """End the job as failed (call it under the lock)."""
        self.job.status, self.job.reason, self.job.active = JobStatus.FAILED, reason, False
        self._save_job()
        log_event(self.log, "job_failed", logging.ERROR, reason=reason)
        self._notify_changed()

    # -- client-facing --------------------------------------------------------------------

    def register(self, name: str, identity: str | None, info: dict[str, str]) -> str:
        """The client's id: its authenticated identity, else its chosen name, else a new one."""
        client_id = identity or name or f"client-{os.urandom(6).hex()}"
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
                    f"client {client_id!r} is not registered; call Register first"
                )
            self.clients.seen(client_id, self.clock())

    def _task_id(self) -> str:
        """The open phase's task id; a secure round run again gets a new one, so clients
        start fresh secure sessions instead of answering with the failed run's keys."""
        return f"r{self.job.round}-{self.job.phase}{self._secure_run()}"

    def _secure_run(self) -> str:
        """Names a run of a secure round after its first (the task id, the cohort's seed)."""
        return f"-s{self.job.secure_attempt}" if self.job.secure_attempt else ""

    def _task_config(self) -> dict[str, Any]:
        job = self.job
        config = {"round": job.round, "rounds": self.config.rounds, **self.config.fit_config}
        if job.phase == Phase.FIT:
            config.update(self.strategy.fit_config(job.round))
        return config

    def _current_task(self, client_id: str) -> TaskInfo:
        job = self.job
        if job.status != JobStatus.RUNNING:
            return TaskInfo(
                TaskType.DONE, job.round, model=self._model_record, reason=job.reason or job.status
            )
        if job.active and not self._aggregating and self._secure is not None:
            return self._secure_task(client_id, self._secure)
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

    def _secure_task(self, client_id: str, secure: SecurePhase) -> TaskInfo:
        """A secure stage for a cohort member the protocol waits for; otherwise wait."""
        job = self.job
        reason = secure.waiting_reason(client_id)
        if reason:
            return TaskInfo(TaskType.WAIT, job.round, retry_after=1.0, reason=reason)
        r = secure.round
        config = self._task_config()
        if r.max_weight is not None:
            config["secure_max_weight"] = r.max_weight
        config.update(self.privacy.task_config(r.server.params.threshold))
        return TaskInfo(
            TaskType.SECURE_FIT,
            job.round,
            self._task_id(),
            self._model_record,
            config,
            secure_stage=r.stage.value,
            secure_setup=r.setup_payload(client_id),
            secure_payload=r.payload_for(client_id),
        )

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
                f"task {task_id!r} is not open (the server is at {current!r}, {job.status})"
            )
        if self._aggregating:
            raise StaleTaskError(f"task {task_id!r} closed: the round is being aggregated")
        if self._secure is not None:
            raise StaleTaskError(
                f"round {task_id!r} is a secure round: plain updates are refused (the client"
                " answers TASK_SECURE_FIT stages with SubmitSecure)"
            )
        status = self.clients.status(client_id)
        if status != Participant.SELECTED:
            raise StaleTaskError(
                f"client {client_id!r} has no open task in {current!r} (status {status})"
            )

    def refuse(self, client_id: str, error: UpdateRejectedError) -> None:
        """Count a refused update against the client, then raise `error`."""
        self.metrics.inc("sporenet_updates_rejected_total")
        with self._changed:
            count = self.clients.refused(client_id)
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

        Raises:
            UpdateRejectedError: the update is malformed or out of bounds.
            StaleTaskError: the task closed meanwhile.

        Before the update counts, its bytes are kept in the phase directory, so an
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
            files = self._files()
            pending: Path | None = files.write_pending(client_id, payload)  # outside the lock
            try:
                with self._changed:
                    self._check_open(client_id, task_id, Phase.FIT)
                    if self._aggregator is None:  # cannot happen while a fit phase is open
                        raise AggregationError("no aggregator for the open fit phase")
                    self._aggregator.add(client_id, update, float(num_samples))
                    files.keep(pending, client_id)  # type: ignore[arg-type]
                    pending = None
                    self._set_status(client_id, Participant.ACCEPTED, num_samples, metrics)
                    self._since_checkpoint += 1
                    if self._since_checkpoint >= self.config.checkpoint_every:
                        self._checkpoint()
                    self.metrics.inc("sporenet_updates_accepted_total")
                    self._wake_if_settled()
            finally:
                del update
                if pending is not None:
                    pending.unlink(missing_ok=True)
        if upload is not None:
            upload.unlink(missing_ok=True)
        log_event(
            self.log,
            "update_accepted",
            client=client_id,
            task=task_id,
            samples=num_samples,
            norm=norm,
        )

    def _checkpoint(self) -> None:
        """Save the aggregate, then drop the kept uploads it now contains."""
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
        """Record one client message of the open secure stage (a resent one is a no-op).

        Raises:
            StaleTaskError: no secure round or stage is open for this client.
            SecAggError: the message is malformed.
        """
        self.touch(client_id)
        metrics = parse_metrics(metrics_json, "metrics_json")
        with self._changed:
            secure, job, current = self._secure, self.job, self._task_id()
            if (
                secure is None
                or job.status != JobStatus.RUNNING
                or task_id != current
                or not job.active
                or self._aggregating
            ):
                why = f": {job.reason}" if job.status == JobStatus.FAILED else ""
                raise StaleTaskError(
                    f"task {task_id!r} is not an open secure round (the server is at "
                    f"{current!r}, {job.status}{why})"
                )
            if not secure.check_message(client_id, stage, current):
                return
            secure.round.submit(client_id, payload)
            if secure.stage == Stage.MASKED_INPUT:
                self._set_status(client_id, Participant.MASKED, num_samples, metrics)
                self.metrics.inc("sporenet_updates_accepted_total")
            self._since_checkpoint += 1
            if self._since_checkpoint >= self.config.checkpoint_every:
                with self.store.transaction() as tx:
                    self._save_secure(tx)
            if not secure.round.pending():
                self.wake.set()  # the round loop can close the stage now
        log_event(self.log, "secure_message", client=client_id, task=task_id, stage=stage)

    def withdraw_secure(self, client_id: str, task_id: str) -> None:
        """The client cannot continue the secure round: stop waiting for it."""
        self.touch(client_id)
        with self._changed:
            secure = self._secure
            if secure is None or task_id != self._task_id() or client_id not in secure.cohort:
                raise StaleTaskError(f"task {task_id!r} is not an open secure round")
            secure.withdrawn.add(client_id)
            self.wake.set()
        log_event(self.log, "secure_withdrawn", logging.WARNING, client=client_id, task=task_id)

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

    # -- the round loop ---------------------------------------------------------------------

    def stop(self) -> None:
        """Wake every held poll so in-flight calls can finish; persists the job."""
        with self._changed:
            self._stopping = True
            self._notify_changed()
            self._checkpoint()
            with self.store.transaction() as tx:
                self._save_secure(tx)
            self._save_job()

    def close(self) -> None:
        self.store.close()

    def _live_clients(self, now: float) -> list[str]:
        return self.clients.live(now, self.config.heartbeat_timeout)

    def tick(self) -> None:
        """Advance the state machine by whatever time and arrivals allow (called ~10×/s)."""
        now = self.clock()
        with self._changed:
            job = self.job
            if job.status != JobStatus.RUNNING or self._aggregating or self._stopping:
                return
            if not job.active:
                self._try_start(now)
                return
            if self._secure is not None:
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
                self._aggregating = False
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
        self._notify_changed()
        return secure.stage == Stage.COMPLETED

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
        fraction = config.fraction if fit else config.evaluate_fraction
        size = min(len(live), max(need, math.ceil(fraction * len(live))))
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
            self._mark_contributors(self._secure, contributors)
            return (
                delta,
                None,
                {"secure_error_bound": self._secure.round.server.result().error_bound},
            )
        if self._aggregator is None:  # cannot happen: set whenever a fit phase is active
            raise AggregationError("no aggregator for the fit phase")
        # Read before result(): adaptive clipping moves the norm for the next round.
        clip = getattr(self._aggregator, "clipping_norm", None)
        return self._aggregator.result(), clip, {}

    def _publish_fit(self) -> None:
        job, t0 = self.job, self.clock()
        try:
            delta, clip, secure_info = self._aggregate()
            new_weights, new_state = self.strategy.apply(self._weights, delta, self._opt_state)
            del delta  # large models: hold at most the sums, the new weights and their bytes
            privacy_info = self._spend_privacy(clip)
        except (AggregationError, SecAggError, PrivacyError) as e:
            with self._changed:
                self._fail_job(f"round {job.round}: {e}")
            return
        data = replace_weights_bytes(self._model_bytes, new_weights)
        del new_weights  # they are in `data` now: hold them once
        version = job.model_version + 1
        record = self.models.write(version, job.round, data)
        self.models.write_moments(version, new_state)
        rows = self.store.participants(job.round, Phase.FIT)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        summary = weighted_metrics(accepted)
        summary["num_samples"] = float(sum(n for n, _ in accepted))
        files = self._files()
        with self._changed:
            with self.store.transaction() as tx:
                tx.add_model(record)
                tx.finish_round(job.round, Phase.FIT, len(accepted), summary)
                tx.delete_secure_state(job.round)
                if privacy_info:  # what this round spent, with the round it paid for
                    tx.set_meta("privacy", self.privacy.state())
                job.model_version = version
                every = self.config.evaluate_every
                self._advance(tx, evaluate_next=bool(every) and job.round % every == 0)
            # Stop now if even the smallest sampling rate a round can have is unaffordable.
            # (After an evaluate phase, the next fit phase's start checks instead.)
            if job.status == JobStatus.RUNNING and job.phase == Phase.FIT:
                why = self.privacy.budget_left(self.privacy.charged_rate(self.config.fraction))
                if why:
                    self._finish_for_budget(why)
            self._model_bytes, self._opt_state = data, new_state
            self._weights = self._weights_reader.read(data)
            self._model_record = record
            self._aggregator = None
            self._secure = None
        files.remove()
        took = self.clock() - t0
        self.metrics.inc("sporenet_rounds_completed_total")
        self.metrics.set("sporenet_aggregation_seconds", took)
        self.metrics.set("sporenet_round_duration_seconds", self.clock() - self._phase_t0)
        self.metrics.set("sporenet_current_round", job.round)
        log_event(
            self.log,
            "round_published",
            round=record.round,
            version=version,
            clients=len(accepted),
            aggregation_s=round(took, 4),
            metrics=summary,
            **secure_info,
            **privacy_info,
        )

    def _spend_privacy(self, clipping_norm: float | None) -> dict[str, Any]:
        """Charge the published round to the ledger; its epsilon etc. for the log."""
        job = self.job
        q = job.dp_sample_rate
        eps = self.privacy.spend(
            job.round, sample_rate=q, cohort=job.dp_cohort, clipping_norm=clipping_norm
        )
        acc = self.privacy.accountant
        if eps is None or acc is None:
            return {}
        self.metrics.set("sporenet_privacy_epsilon", eps)
        log_event(
            self.log,
            "privacy_spent",
            round=job.round,
            epsilon=eps,
            delta=acc.delta,
            sample_rate=q,
            budget=acc.epsilon_budget,
        )
        return {"epsilon": eps, "delta": acc.delta}

    def _mark_contributors(self, secure: SecurePhase, contributors: Sequence[str]) -> None:
        """After a secure round: contributors are accepted, the rest of the cohort dropped."""
        rows = self.store.participants(self.job.round, Phase.FIT)
        done = set(contributors)
        with self._changed, self.store.transaction() as tx:
            for cid in secure.cohort:
                _, n, m = rows.get(cid, ("", 0, {}))
                status = Participant.ACCEPTED if cid in done else Participant.DROPPED
                self._set_status(cid, status, n, m, tx=tx)

    def _finish_evaluate(self) -> None:
        job = self.job
        rows = self.store.participants(job.round, Phase.EVALUATE)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        summary = weighted_metrics(accepted)
        with self._changed, self.store.transaction() as tx:
            tx.finish_round(job.round, Phase.EVALUATE, len(accepted), summary)
            self._advance(tx, evaluate_next=False)
        log_event(
            self.log, "evaluation_finished", round=job.round, clients=len(accepted), metrics=summary
        )

    def _advance(self, tx: Any, *, evaluate_next: bool) -> None:
        """Move the job past the phase that just closed (inside the caller's transaction)."""
        job = self.job
        if evaluate_next:
            job.phase = Phase.EVALUATE
        else:
            job.phase = Phase.FIT
            job.round += 1
            if job.round > self.config.rounds:
                job.status = JobStatus.FINISHED
                job.reason = f"all {self.config.rounds} rounds done"
        job.active, job.attempt, job.waiting_since = False, 0, self.clock()
        job.secure_attempt = 0
        self.clients.end_phase()
        tx.set_job(job)
        if job.status == JobStatus.FINISHED:
            log_event(
                self.log, "job_finished", rounds=self.config.rounds, model_version=job.model_version
            )


__all__ = ["RoundManager", "TaskInfo", "weighted_metrics"]
