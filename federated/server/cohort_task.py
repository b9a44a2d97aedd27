"""The task a round's cohort holds: the membership rules plain fit, secure fit and
evaluate share (one task id per phase; a client answers once, while selected)."""

from __future__ import annotations

from sporenet.federated.errors import StaleTaskError, quote
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.open_phase import Answer
from sporenet.federated.server.phases import Participant


class CohortTask:
    """Whether a task id is the open phase's and whether a client of it may answer."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx

    def owns(self, task_id: str) -> bool:
        return task_id == self._ctx.machine.task_id()

    def answered(self, client_id: str, task_id: str) -> bool:
        accepted = self._ctx.clients.status(client_id) == Participant.ACCEPTED
        return accepted and self.owns(task_id)

    def selected(self, client_id: str) -> bool:
        return self._ctx.clients.status(client_id) == Participant.SELECTED

    def check_answer(
        self, client_id: str, answer: type[Answer], expected: type[Answer], refusal: str
    ) -> None:
        """Raise StaleTaskError unless `answer` is the phase's kind and the client holds
        its task; `refusal` says what the phase is, for an answer of another kind."""
        task_id = self._ctx.machine.task_id()
        if answer is not expected:
            raise StaleTaskError(f"task {quote(task_id)} {refusal}")
        status = self._ctx.clients.status(client_id)
        if status != Participant.SELECTED:
            raise StaleTaskError(
                f"client {quote(client_id)} has no open task in {task_id!r} (status {status})"
            )
