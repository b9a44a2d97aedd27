"""The edge's round manager: the server's state machine, driven by the cloud's tasks.

Each task the cloud gives the edge becomes one local round of one phase (fit or
evaluate) on the cloud's model and config. The phase runs among the edge's devices
exactly as on a server: sampling, deadlines, dropouts, validation, replacements, plain
or SecAgg+ aggregation, all persisted in the state dir. Closing it does not publish a
model: the edge keeps the partial aggregate (its devices' weighted mean delta, their
total weight and metrics) in the state dir until the upstream participant has sent it,
and waits for the cloud's next task. A fit phase still short of `min_clients` updates
at its deadline, and an evaluate phase nobody answered, withdraw from the cloud's task
(the cloud's deadline then treats the edge as a straggler) instead of failing the job.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from sporenet.federated.aggregation import Weights
from sporenet.federated.common.codec import decode_update, encode_update
from sporenet.federated.errors import AggregationError
from sporenet.federated.secagg import SecAggError
from sporenet.federated.server import restore
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.models import write_atomic
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.phases import JobStatus, Participant, Phase
from sporenet.federated.server.round_loop import Clock, weighted_metrics
from sporenet.federated.server.rounds import RoundManager

TASK_META = "edge_task"
RESULT_FILE = "edge-result.bin"


class TaskState(StrEnum):
    """Where the edge stands on the cloud's current task."""

    OPEN = "open"  # the local phase runs (or waits for devices)
    DONE = "done"  # the partial aggregate is ready to send
    WITHDRAWN = "withdrawn"  # too few devices answered: the edge sits this task out


@dataclass
class EdgeTask:
    """The cloud's task the edge works on, and its outcome (saved in the store's meta)."""

    task_id: str
    phase: Phase
    cloud_round: int
    config: dict[str, Any]
    local_round: int
    state: TaskState = TaskState.OPEN
    weight: int = 0  # total weight of the partial aggregate (sample count)
    metrics: dict[str, float] = field(default_factory=dict)
    loss: float = 0.0  # evaluate tasks: the sample-weighted mean loss
    reason: str = ""  # why it was withdrawn

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> EdgeTask:
        meta = dict(meta)
        meta["phase"], meta["state"] = Phase(meta["phase"]), TaskState(meta["state"])
        return cls(**meta)


@dataclass(frozen=True)
class EdgeResult:
    """What the edge sends upstream for a task (None of it for a withdrawn task)."""

    delta: Weights | None
    weight: int
    metrics: dict[str, float]
    loss: float = 0.0


class EdgeRoundManager(RoundManager):
    """RoundManager whose phases are the cloud's tasks and whose output is a partial sum."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics,
        logger: logging.Logger,
        clock: Clock = time.time,
    ) -> None:
        # Read by the overridden hooks that the base constructor may already call.
        self._task: EdgeTask | None = None
        super().__init__(config, metrics=metrics, logger=logger, clock=clock)
        saved = self.store.get_meta(TASK_META)
        self._task = EdgeTask.from_meta(saved) if saved else None

    # -- called by the upstream participant -----------------------------------------------

    def begin(
        self, *, task_id: str, phase: Phase, cloud_round: int, config: dict[str, Any], model: bytes
    ) -> None:
        """Start working on the cloud's task `task_id` with its `model` (a no-op when it is
        the task already in hand, e.g. after the edge restarted)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._aggregating)  # let a close finish
            current = self._task
            if current is not None and current.task_id == task_id:
                return
            if self.job.active:  # the cloud moved on: the old task's phase is void
                self._abandon_phase()
            job = self.job
            local_round = current.local_round + 1 if current is not None else job.round
            self._import_model(model, local_round)
            job.round, job.phase, job.active = local_round, phase, False
            job.attempt = job.secure_attempt = 0
            job.waiting_since = self.clock()
            self._task = EdgeTask(task_id, phase, cloud_round, dict(config), local_round)
            with self.store.transaction() as tx:
                tx.set_job(job)
                tx.set_meta(TASK_META, asdict(self._task))
            self._notify_changed()
            self.wake.set()
        log_event(
            self.log,
            "edge_task_started",
            task=task_id,
            phase=phase,
            cloud_round=cloud_round,
            round=local_round,
        )

    def wait(self, task_id: str, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `task_id` to settle; True once it has (its
        partial aggregate is ready, the edge withdrew, or the task in hand is another)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._settled(task_id), timeout)

    def _settled(self, task_id: str) -> bool:
        task = self._task
        return task is None or task.task_id != task_id or task.state != TaskState.OPEN

    def result(self, task_id: str) -> EdgeResult | None:
        """The partial aggregate of `task_id` once settled; None when the edge withdrew
        from it (or it is not the task in hand)."""
        with self._lock:
            task = self._task
            if task is None or task.task_id != task_id or task.state != TaskState.DONE:
                return None
        delta = None
        if task.phase == Phase.FIT:
            delta = decode_update((self.dir / RESULT_FILE).read_bytes(), self._template)
        return EdgeResult(delta, task.weight, dict(task.metrics), task.loss)

    def withdraw(self, task_id: str, reason: str) -> None:
        """Stop working on `task_id` (the cloud closed it without this edge)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._aggregating)  # it may be settling now
            if self._task is not None and self._task.task_id == task_id:
                self._fail_job(reason)

    def finish(self, model: bytes | None, reason: str) -> None:
        """The cloud's job ended: devices get its final model with TASK_DONE."""
        with self._changed:
            self._changed.wait_for(lambda: not self._aggregating)
            if self.job.active:
                self._abandon_phase()
            if model is not None:
                self._import_model(model, self.job.round)
            self.job.status, self.job.reason = JobStatus.FINISHED, reason
            self._save_job()
            self._notify_changed()
        log_event(self.log, "job_finished", reason=reason, model_version=self.job.model_version)

    # -- the base state machine's hooks -----------------------------------------------------

    def _task_config(self) -> dict[str, Any]:
        """The cloud's task config (round, strategy settings such as FedProx's mu, and the
        cloud's fit_config) goes to the devices unchanged."""
        return dict(self._task.config) if self._task is not None else {}

    def _try_start(self, now: float) -> None:
        task = self._task
        if task is None or task.state != TaskState.OPEN:
            return  # nothing to do until the cloud gives the next task
        super()._try_start(now)

    def _phase_may_close(self, now: float) -> bool:
        """As on a server, except that a fit phase still short of `min_clients` at its
        deadline withdraws instead of asking replacements forever."""
        job = self.job
        if job.phase == Phase.FIT and now >= job.deadline:
            self._drop_silent(now)
            accepted = self.clients.count(Participant.ACCEPTED)
            if accepted < self.config.min_clients:
                self._fail_job(
                    f"round {job.round}: {accepted} device update(s) by the deadline, "
                    f"min_clients is {self.config.min_clients}"
                )
                return False
            return True  # report what arrived
        return super()._phase_may_close(now)

    def _fail_job(self, reason: str) -> None:
        """A local phase that cannot complete withdraws from the cloud's task; the edge's
        own job goes on with the next task (call it under the lock)."""
        self._clear_uploads()
        if self._task is None or self._task.state != TaskState.OPEN:
            return
        self._abandon_phase()
        self._task.state, self._task.reason = TaskState.WITHDRAWN, reason
        with self.store.transaction() as tx:
            tx.set_meta(TASK_META, asdict(self._task))
            tx.set_job(self.job)
        log_event(
            self.log, "edge_task_withdrawn", logging.WARNING, task=self._task.task_id, reason=reason
        )
        self._notify_changed()

    def _publish_fit(self) -> None:
        """Keep the devices' weighted mean delta and total weight for the cloud."""
        job = self.job
        try:
            delta, _clip, secure_info = self._aggregate()
        except (AggregationError, SecAggError) as e:
            with self._changed:
                self._fail_job(f"round {job.round}: {e}")
            return
        rows = self.store.participants(job.round, Phase.FIT)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        weight = self._partial_weight([n for n, _ in accepted])
        summary = weighted_metrics(accepted)
        write_atomic(self.dir / RESULT_FILE, encode_update(delta))
        del delta
        files = self._files()
        with self._changed:
            with self.store.transaction() as tx:
                tx.finish_round(job.round, Phase.FIT, len(accepted), summary)
                tx.delete_secure_state(job.round)
                self._settle(tx, weight=weight, metrics=summary)
            self._aggregator = None
            self._secure = None
        files.remove()
        self.metrics.inc("sporenet_rounds_completed_total")
        log_event(
            self.log,
            "edge_round_aggregated",
            round=job.round,
            task=self._task.task_id if self._task else "",
            clients=len(accepted),
            weight=weight,
            metrics=summary,
            **secure_info,
        )

    def _finish_evaluate(self) -> None:
        """Keep the devices' sample-weighted loss and metrics, with their sample count."""
        job = self.job
        rows = self.store.participants(job.round, Phase.EVALUATE)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        with self._changed:
            if not accepted:
                self._fail_job(f"round {job.round}: no device reported an evaluation")
                return
            summary = weighted_metrics(accepted)
            loss = summary.pop("loss")
            with self.store.transaction() as tx:
                tx.finish_round(job.round, Phase.EVALUATE, len(accepted), summary)
                self._settle(tx, weight=sum(n for n, _ in accepted), metrics=summary, loss=loss)
        log_event(self.log, "edge_evaluation_finished", round=job.round, clients=len(accepted))

    # -- helpers ----------------------------------------------------------------------------

    def _partial_weight(self, samples: list[int]) -> int:
        """The weight the partial aggregate carries: the devices' total sample count; under
        SecAgg+ the sum of the weights its secure mean used (min(n, max_weight) each, or
        one per device when the secure round is unweighted)."""
        sa = self.config.secure_aggregation
        if sa is None:
            return sum(samples)
        if sa.max_weight is None:
            return len(samples)
        return round(sum(min(n, sa.max_weight) for n in samples))

    def _settle(
        self, tx: Any, *, weight: int, metrics: dict[str, float], loss: float = 0.0
    ) -> None:
        """The task's outcome is ready (inside the caller's transaction, under the lock)."""
        task = self._task
        if task is None:  # cannot happen: a phase runs only for a task
            raise AggregationError("an edge phase closed without a cloud task")
        task.state, task.weight, task.metrics, task.loss = TaskState.DONE, weight, metrics, loss
        job = self.job
        job.active, job.attempt = False, 0
        self.clients.end_phase()
        self._clear_uploads()
        tx.set_meta(TASK_META, asdict(task))
        tx.set_job(job)
        self._notify_changed()

    def _abandon_phase(self) -> None:
        """Drop the open local phase (under the lock): its task is withdrawn or void."""
        files = self._files()
        self.job.active = False
        self._aggregator = None
        self._secure = None
        self.clients.end_phase()
        self._clear_uploads()
        self._save_job()
        files.remove()

    def _import_model(self, model: bytes, local_round: int) -> None:
        """Make the cloud's `model` the edge's current model (a new local version unless
        it is the one held)."""
        if hashlib.sha256(model).hexdigest() == self._model_record.sha256:
            return
        version = self.job.model_version + 1
        record = self.models.write(version, local_round, model)
        self.job.model_version = version
        with self.store.transaction() as tx:
            tx.add_model(record)
            tx.set_job(self.job)
        restore.load_model(self, version)
