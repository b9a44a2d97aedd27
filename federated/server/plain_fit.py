"""The plain fit phase: selected clients upload updates, folded into one aggregator.

Every accepted update is folded at once and acknowledged once the aggregate holding it
is checkpointed (a batch of up to `checkpoint_every` updates: group_commit.py), so a
`kill -9` loses none that was acknowledged (the others are sent again) and a restart
folds none twice (`restore`). The phase closes when the machine says so
(machine.py: everyone answered, or the deadline with enough updates).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sporenet.federated.aggregation import Aggregator, Weights
from sporenet.federated.common.codec import decode_update
from sporenet.federated.errors import (
    AggregationError,
    ConfigError,
    StaleTaskError,
    UpdateRejectedError,
)
from sporenet.federated.server.cohort_task import CohortTask
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.machine import Verdict
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.open_phase import (
    Answer,
    FitResult,
    Tick,
    TickResult,
    Update,
)
from sporenet.federated.server.phases import Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.restore import Rows
from sporenet.federated.server.selection import drop_silent, persist_step

#: Rebuilds a journalled update as it was folded: (client, decoded update, its row) -> update.
Refold = Callable[[str, Weights, tuple[str, int, dict[str, Any]]], Weights]


def restore_aggregate(ctx: JobContext, agg: Aggregator, rows: Rows, refold: Refold) -> None:
    """The open fit phase's aggregate after a restart: the last checkpoint, then every
    accepted update it lacks from the journal (which builds before group commit wrote);
    an accepted client whose update is in neither is asked for it again (selected once
    more: its upload was never acknowledged, or the old journal lost it)."""
    files = ctx.files()
    try:
        files.restore(agg)
    except AggregationError as e:
        raise ConfigError(
            f"state dir {str(ctx.dir)!r} is damaged: {e}; move that file aside and "
            "start again: the clients whose updates it held are asked for them again"
        ) from None
    folded, refolded = set(agg.clients), 0
    journalled = files.rows()
    for cid, row in rows.items():
        status, n, _ = row
        if status != Participant.ACCEPTED or cid in folded:
            continue
        kept = files.read_kept(cid)
        update = None
        if kept is not None:
            try:
                update = decode_update(kept, ctx.model.template)
            except UpdateRejectedError:
                update = None
        if update is not None:
            agg.add(cid, refold(cid, update, row), float(n))
            refolded += 1
            continue
        if cid in journalled:  # the previous build's journal holds it, damaged
            log_event(
                ctx.log,
                "kept_update_lost",
                level=logging.WARNING,
                client=cid,
                file=str(files.journal_path),
            )
        else:  # its row was saved, the checkpoint after it not: never acknowledged
            log_event(ctx.log, "update_not_saved", client=cid)
        ctx.set_status(cid, Participant.SELECTED)  # asked for its update again
    log_event(ctx.log, "aggregate_restored", checkpointed=len(folded), refolded=refolded)


class PlainFit:
    """A fit phase whose updates the server sees (one by one, into a running sum)."""

    kind = Phase.FIT

    def __init__(self, ctx: JobContext, task_config: dict[str, Any]) -> None:
        self._ctx = ctx
        self._cohort = CohortTask(ctx)
        self._task_config = task_config
        self._aggregator = ctx.privacy.make_aggregator(
            ctx.strategy, ctx.model.template, ctx.job.dp_cohort
        )
        self._since_checkpoint = 0

    def start(self, now: float, cohort: list[str]) -> None:
        self._since_checkpoint = 0

    def restore(self, rows: Rows) -> None:
        """After a restart: the last checkpoint, then the journalled updates it lacks."""
        restore_aggregate(self._ctx, self._aggregator, rows, lambda cid, update, row: update)

    def task(self, client_id: str) -> TaskInfo | None:
        ctx = self._ctx
        if ctx.clients.status(client_id) != Participant.SELECTED:
            return None
        config = {**self._task_config, **ctx.privacy.task_config()}
        job = ctx.job
        return TaskInfo(TaskType.FIT, job.round, ctx.machine.task_id(), ctx.model.record, config)

    def owns(self, client_id: str, task_id: str) -> bool:
        return self._cohort.owns(task_id)

    def answered(self, client_id: str, task_id: str) -> bool:
        return self._cohort.answered(client_id, task_id)

    def wants(self, client_id: str, task_id: str) -> bool:
        return self._cohort.selected(client_id)

    def accepts(self, client_id: str, answer: type[Answer]) -> None:
        self._cohort.check_answer(client_id, answer, Update, "is not an open secure round")

    def submit(self, client_id: str, answer: Answer) -> None:
        """Fold the update (under the lock); it is acknowledged once a checkpoint holds
        it: this one's, when it fills the batch."""
        if not isinstance(answer, Update):
            raise StaleTaskError("a plain fit phase takes updates only")
        ctx = self._ctx
        n, metrics = answer.num_samples, answer.metrics
        self._aggregator.add(client_id, answer.tensors, float(n))
        ctx.set_status(client_id, Participant.ACCEPTED, n, metrics, journalled=True)
        ctx.commits.accept()
        self._since_checkpoint += 1
        if self._since_checkpoint >= ctx.config.checkpoint_every:
            self.checkpoint()
        ctx.metrics.inc("sporenet_updates_accepted_total")
        ctx.wake_if_settled()

    def tick(self, now: float) -> TickResult:
        drop_silent(self._ctx, now)
        step = self._ctx.machine.step(now)
        persist_step(self._ctx, step)
        if step.verdict == Verdict.CLOSE:
            return TickResult(Tick.CLOSE)
        if step.verdict == Verdict.FAIL:
            return TickResult(Tick.FAIL, step.reason)
        return TickResult(Tick.OPEN)

    def close(self) -> FitResult:
        # Read before result(): adaptive clipping moves the norm for the next round.
        clip = getattr(self._aggregator, "clipping_norm", None)
        return FitResult(self._aggregator.result(), clip)

    def save(self, tx: Any) -> None:
        pass  # the checkpoints hold its progress

    def checkpoint(self) -> None:
        """Save the accepted rows and the aggregate, and acknowledge the updates it holds."""
        self._ctx.checkpoint(self._aggregator)
        self._since_checkpoint = 0

    def follow(self, tx: Any) -> None:
        return None  # the job waits for enough live clients to start the next phase

    def enter(self) -> None:
        pass

    def stage(self) -> str | None:
        return None
