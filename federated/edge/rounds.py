"""The edge's rounds: the server's round manager with the edge's publisher, driven by the
cloud's tasks.

Each task the cloud gives the edge becomes one local round of one phase (fit or
evaluate) on the cloud's model and config. The phase runs among the edge's devices
exactly as on a server: sampling, deadlines, dropouts, validation, replacements, plain
or SecAgg+ aggregation, all persisted in the state dir. Closing it does not publish a
model: the edge keeps the partial aggregate (its devices' weighted mean delta, their
total weight and metrics) in the state dir until the upstream participant has sent it,
and waits for the cloud's next task. A fit phase still short of `min_clients` updates
at its deadline, and an evaluate phase nobody answered, withdraw from the cloud's task
(the cloud's deadline then treats the edge as a straggler) instead of failing the job.

`EdgePublisher` is that tier's `Publisher` (server/publisher.py) for the shared
`RoundManager`; `EdgeRoundManager` composes the two and adds what the upstream
participant calls (begin, wait, result, withdraw, finish).
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
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.job_context import Clock, JobContext
from sporenet.federated.server.models import write_atomic
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.open_phase import FitResult, OpenPhase
from sporenet.federated.server.phases import Phase
from sporenet.federated.server.publisher import accepted_rows, weighted_metrics
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
    model_sha256: str = ""  # of the cloud's model the task names
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


class EdgePublisher:
    """The edge tier's publisher: a closed phase settles the cloud's task in hand."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        saved = ctx.store.get_meta(TASK_META)
        self.task: EdgeTask | None = EdgeTask.from_meta(saved) if saved else None

    @property
    def pending(self) -> bool:
        return False  # a partial aggregate is written in one go; nothing is retried

    def may_start(self) -> bool:
        task = self.task
        return task is not None and task.state == TaskState.OPEN

    def task_config(self) -> dict[str, Any]:
        """The cloud's task config (round, strategy settings such as FedProx's mu, and the
        cloud's fit_config) goes to the devices unchanged."""
        return dict(self.task.config) if self.task is not None else {}

    def fail(self, reason: str) -> None:
        """A local phase that cannot complete withdraws from the cloud's task; the edge's
        own job goes on with the next task (call it under the lock)."""
        ctx = self._ctx
        ctx.uploads.clear()
        task = self.task
        if task is None or task.state != TaskState.OPEN:
            return
        self.abandon_phase()
        task.state, task.reason = TaskState.WITHDRAWN, reason
        with ctx.store.transaction() as tx:
            tx.set_meta(TASK_META, asdict(task))
            tx.set_job(ctx.job)
        log_event(ctx.log, "edge_task_withdrawn", logging.WARNING, task=task.task_id, reason=reason)
        ctx.notify()

    def publish_fit(self, phase: OpenPhase) -> None:
        """Keep the devices' weighted mean delta and total weight for the cloud."""
        ctx = self._ctx
        job = ctx.job
        try:
            result = phase.close()
            if not isinstance(result, FitResult):  # cannot happen: fit phases return one
                raise AggregationError("the fit phase closed without a result")
        except (AggregationError, SecAggError) as e:
            with ctx.changed:
                self.fail(f"round {job.round}: {e}")
            return
        accepted = accepted_rows(ctx, Phase.FIT)
        weight = self._partial_weight([n for n, _ in accepted])
        summary = weighted_metrics(accepted)
        write_atomic(ctx.dir / RESULT_FILE, encode_update(result.delta))
        info = result.info
        del result
        files = ctx.files()
        with ctx.changed, ctx.store.transaction() as tx:
            tx.finish_round(job.round, Phase.FIT, len(accepted), summary)
            tx.delete_secure_state(job.round)
            self._settle(tx, weight=weight, metrics=summary)
        ctx.commits.made_durable()  # the kept result holds the round's updates
        files.remove()
        ctx.metrics.inc("sporenet_rounds_completed_total")
        log_event(
            ctx.log,
            "edge_round_aggregated",
            round=job.round,
            task=self.task.task_id if self.task else "",
            clients=len(accepted),
            weight=weight,
            metrics=summary,
            **info,
        )

    def finish_evaluate(self) -> None:
        """Keep the devices' sample-weighted loss and metrics, with their sample count."""
        ctx = self._ctx
        job = ctx.job
        accepted = accepted_rows(ctx, Phase.EVALUATE)
        with ctx.changed:
            if not accepted:
                self.fail(f"round {job.round}: no device reported an evaluation")
                return
            summary = weighted_metrics(accepted)
            loss = summary.pop("loss")
            with ctx.store.transaction() as tx:
                tx.finish_round(job.round, Phase.EVALUATE, len(accepted), summary)
                self._settle(tx, weight=sum(n for n, _ in accepted), metrics=summary, loss=loss)
        log_event(ctx.log, "edge_evaluation_finished", round=job.round, clients=len(accepted))

    def _partial_weight(self, samples: list[int]) -> int:
        """The weight the partial aggregate carries: the devices' total sample count; under
        SecAgg+ the sum of the weights its secure mean used (min(n, max_weight) each, or
        one per device when the secure round is unweighted)."""
        sa = self._ctx.config.secure_aggregation
        if sa is None:
            return sum(samples)
        if sa.max_weight is None:
            return len(samples)
        return round(sum(min(n, sa.max_weight) for n in samples))

    def _settle(
        self, tx: Any, *, weight: int, metrics: dict[str, float], loss: float = 0.0
    ) -> None:
        """The task's outcome is ready (inside the caller's transaction, under the lock)."""
        ctx, task = self._ctx, self.task
        if task is None:  # cannot happen: a phase runs only for a task
            raise AggregationError("an edge phase closed without a cloud task")
        task.state, task.weight, task.metrics, task.loss = TaskState.DONE, weight, metrics, loss
        job = ctx.job
        job.active, job.attempt = False, 0
        ctx.end_phase()
        tx.set_meta(TASK_META, asdict(task))
        tx.set_job(job)
        ctx.notify()

    def abandon_phase(self) -> None:
        """Drop the open local phase (under the lock): its task is withdrawn or void."""
        ctx = self._ctx
        files = ctx.files()
        ctx.job.active = False
        ctx.end_phase()
        ctx.save_job()
        files.remove()


class EdgeRoundManager:
    """The edge's device-facing `RoundManager` (run by `run_server`) and the calls with
    which the upstream participant hands it the cloud's tasks."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        metrics: Metrics,
        logger: logging.Logger,
        clock: Clock = time.time,
    ) -> None:
        publishers: list[EdgePublisher] = []

        def make(ctx: JobContext) -> EdgePublisher:
            publishers.append(EdgePublisher(ctx))
            return publishers[-1]

        self.rounds = RoundManager(
            config,
            metrics=metrics,
            logger=logger,
            clock=clock,
            publisher=make,
            reselect_when_short=False,
        )
        self._tier = publishers[0]
        self.log = logger

    @property
    def task(self) -> EdgeTask | None:
        """The cloud's task in hand, and its outcome."""
        return self._tier.task

    # -- called by the upstream participant -----------------------------------------------

    def begin(
        self, *, task_id: str, phase: Phase, cloud_round: int, config: dict[str, Any], model: bytes
    ) -> None:
        """Start working on the cloud's task `task_id` with its `model` (a no-op when it is
        the task already in hand, e.g. after the edge restarted; a task of the same id on
        another model, from a cloud job started afresh, is a new task)."""
        digest = hashlib.sha256(model).hexdigest()
        with self.rounds.settled() as ctx:  # let a close finish
            current = self._tier.task
            if current is not None and (current.task_id, current.model_sha256) == (
                task_id,
                digest,
            ):
                return
            if ctx.job.active:  # the cloud moved on: the old task's phase is void
                self._tier.abandon_phase()
            job = ctx.job
            local_round = current.local_round + 1 if current is not None else job.round
            self._import_model(ctx, model, local_round)
            ctx.machine.begin(ctx.clock(), local_round, phase)
            self._tier.task = EdgeTask(
                task_id, phase, cloud_round, dict(config), local_round, digest
            )
            with ctx.store.transaction() as tx:
                tx.set_job(job)
                tx.set_meta(TASK_META, asdict(self._tier.task))
            ctx.notify()
            ctx.wake.set()
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
        changed = self.rounds.context.changed
        with changed:
            return changed.wait_for(lambda: self._settled(task_id), timeout)

    def _settled(self, task_id: str) -> bool:
        task = self._tier.task
        return task is None or task.task_id != task_id or task.state != TaskState.OPEN

    def result(self, task_id: str) -> EdgeResult | None:
        """The partial aggregate of `task_id` once settled; None when the edge withdrew
        from it (or it is not the task in hand)."""
        ctx = self.rounds.context
        with ctx.lock:
            task = self._tier.task
            if task is None or task.task_id != task_id or task.state != TaskState.DONE:
                return None
        delta = None
        if task.phase == Phase.FIT:
            delta = decode_update((ctx.dir / RESULT_FILE).read_bytes(), ctx.model.template)
        return EdgeResult(delta, task.weight, dict(task.metrics), task.loss)

    def withdraw(self, task_id: str, reason: str) -> None:
        """Stop working on `task_id` (the cloud closed it without this edge)."""
        with self.rounds.settled():  # it may be settling now
            task = self._tier.task
            if task is not None and task.task_id == task_id:
                self._tier.fail(reason)

    def finish(self, model: bytes | None, reason: str) -> None:
        """The cloud's job ended: devices get its final model with TASK_DONE."""
        with self.rounds.settled() as ctx:
            if ctx.job.active:
                self._tier.abandon_phase()
            if model is not None:
                self._import_model(ctx, model, ctx.job.round)
            ctx.machine.finish(reason)
            ctx.save_job()
            ctx.notify()
        log_event(self.log, "job_finished", reason=reason, model_version=ctx.job.model_version)

    def all_told_done(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every registered device has been told the
        job is done and holds its final model (the transport reports each delivery, not
        each DONE task: a device told before its download would find the edge gone)."""
        ctx = self.rounds.context
        with ctx.changed:
            return ctx.changed.wait_for(self.rounds.told_every_client, timeout)

    def stop(self) -> None:
        self.rounds.stop()

    def close(self) -> None:
        self.rounds.close()

    @staticmethod
    def _import_model(ctx: JobContext, model: bytes, local_round: int) -> None:
        """Make the cloud's `model` the edge's current model (a new local version unless
        it is the one held)."""
        if hashlib.sha256(model).hexdigest() == ctx.model.record.sha256:
            return
        version = ctx.job.model_version + 1
        record = ctx.models.write(version, local_round, model)
        ctx.job.model_version = version
        with ctx.store.transaction() as tx:
            tx.add_model(record)
            tx.set_job(ctx.job)
        ctx.model.load(ctx.store, version)
