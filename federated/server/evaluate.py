"""The evaluate phase: selected clients report a loss and metrics on the current model.

Reports are stored with the participant's status (nothing else to fold); the phase
closes when everyone answered or at its deadline, and the publisher summarises them
(their sample-weighted means) from the store.
"""

from __future__ import annotations

from typing import Any

from sporenet.federated.errors import StaleTaskError
from sporenet.federated.server.cohort_task import CohortTask
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.machine import Verdict
from sporenet.federated.server.open_phase import Answer, Evaluation, Tick, TickResult
from sporenet.federated.server.phases import Participant, Phase, TaskInfo, TaskType
from sporenet.federated.server.selection import drop_silent


class EvaluatePhase:
    """Every selected client evaluates the current model once."""

    kind = Phase.EVALUATE

    def __init__(self, ctx: JobContext, task_config: dict[str, Any]) -> None:
        self._ctx = ctx
        self._cohort = CohortTask(ctx)
        self._task_config = task_config

    def start(self, now: float, cohort: list[str]) -> None:
        pass  # the cohort's statuses are all it has

    def task(self, client_id: str) -> TaskInfo | None:
        ctx = self._ctx
        if ctx.clients.status(client_id) != Participant.SELECTED:
            return None
        job = ctx.job
        return TaskInfo(
            TaskType.EVALUATE,
            job.round,
            ctx.machine.task_id(),
            ctx.model.record,
            dict(self._task_config),
        )

    def owns(self, client_id: str, task_id: str) -> bool:
        return self._cohort.owns(task_id)

    def answered(self, client_id: str, task_id: str) -> bool:
        return self._cohort.answered(client_id, task_id)

    def wants(self, client_id: str, task_id: str) -> bool:
        return self._cohort.selected(client_id)

    def accepts(self, client_id: str, answer: type[Answer]) -> None:
        self._cohort.check_answer(client_id, answer, Evaluation, "is an evaluate phase")

    def submit(self, client_id: str, answer: Answer) -> None:
        if not isinstance(answer, Evaluation):
            raise StaleTaskError("an evaluate phase takes evaluations only")
        metrics = {"loss": answer.loss, **answer.metrics}
        self._ctx.set_status(client_id, Participant.ACCEPTED, answer.num_samples, metrics)
        self._ctx.wake_if_settled()

    def tick(self, now: float) -> TickResult:
        drop_silent(self._ctx, now)
        if self._ctx.machine.step(now).verdict == Verdict.CLOSE:
            return TickResult(Tick.CLOSE)
        return TickResult(Tick.OPEN)

    def close(self) -> None:
        return None

    def save(self, tx: Any) -> None:
        pass  # every report is stored as it arrives

    def checkpoint(self) -> None:
        pass

    def follow(self, tx: Any) -> None:
        return None  # the job waits for enough live clients to start the next phase

    def enter(self) -> None:
        pass

    def stage(self) -> str | None:
        return None
