"""What both secure fit phases are built on: the job, its SecAgg+ settings, how a round
among a cohort is started, timed, resumed after a restart and handed to a client.

A secure round (secure_fit.py) runs SecAgg+ among a sampled cohort that trains at its
masked-input stage; a secure buffer (secure_async_fit.py) runs it among the devices that
already trained, so its masked-input stage only masks and has a key stage's time. Both
phases hold one `SecureSetup` instead of each checking the settings, mapping SecAgg+'s
start errors and computing deadlines its own way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sporenet.federated.errors import AggregationError
from sporenet.federated.secagg import Stage
from sporenet.federated.server.config import SecureConfig
from sporenet.federated.server.job_context import JobContext
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.phases import TaskInfo, TaskType
from sporenet.federated.server.secure_buffer import SecureBuffer
from sporenet.federated.server.secure_phase import SecurePhase


@dataclasses.dataclass(frozen=True)
class SecureSetup:
    """A secure fit phase's job, task config and settings (see the module docstring).

    `trains`: whether the cohort trains at the masked-input stage (a round's does, so
    that stage gets `round_timeout`; a buffer's members trained before it formed).
    """

    ctx: JobContext
    task_config: dict[str, Any]
    settings: SecureConfig
    trains: bool = True

    def for_round(self, round: int) -> SecureSetup:
        """The same setup for the job's next round (its tasks say which)."""
        return dataclasses.replace(self, task_config={**self.task_config, "round": round})

    def start(self, cohort: list[str], now: float) -> SecurePhase:
        """A new SecAgg+ round among `cohort`, its first stage due a stage's time after `now`.

        Raises:
            AggregationError: secure aggregation is not configured, or SecAgg+ cannot
                start with this cohort.
        """
        sa = self._configured()
        secure = SecurePhase.start(
            sa.protocol, cohort, self.ctx.model.template, max_weight=sa.max_weight
        )
        secure.deadline = now + self.stage_timeout(secure)
        return secure

    def form(self, buffer: SecureBuffer, now: float) -> SecurePhase:
        """Start the secure round among a full buffer's members (`start`'s errors too)."""
        sa = self._configured()
        return buffer.form(
            sa.protocol,
            self.ctx.model.template,
            max_weight=sa.max_weight,
            deadline=now + self.settings.stage_timeout,
        )

    def _configured(self) -> SecureConfig:
        sa = self.ctx.config.secure_aggregation
        if sa is None:  # cannot happen: the manager makes a secure phase only when configured
            raise AggregationError("secure aggregation is not configured")
        return sa

    def stage_timeout(self, secure: SecurePhase) -> float:
        """The open stage's time: `round_timeout` where the cohort trains, the key and
        share exchanges (and a buffer's masking) `stage_timeout`."""
        if self.trains and secure.stage == Stage.MASKED_INPUT:
            return self.ctx.config.round_timeout
        return self.settings.stage_timeout

    def resume(self, secure: SecurePhase, event: str) -> None:
        """A round a restart found in the store: its open stage gets at least
        `resume_grace` from now, and the restart is logged as `event`."""
        ctx = self.ctx
        secure.deadline = ctx.clock() + max(self.stage_timeout(secure), ctx.config.resume_grace)
        log_event(ctx.log, event, round=ctx.job.round, stage=secure.stage.value)

    def task(self, secure: SecurePhase, client_id: str) -> TaskInfo:
        """The client's secure stage task, or a wait (with the reason) when the open
        stage does not wait for it."""
        ctx = self.ctx
        reason = secure.waiting_reason(client_id)
        if reason:
            return TaskInfo(TaskType.WAIT, ctx.job.round, retry_after=1.0, reason=reason)
        r = secure.round
        task_config = dict(self.task_config)
        if r.max_weight is not None:
            task_config["secure_max_weight"] = r.max_weight
        task_config.update(ctx.privacy.task_config(r.server.params.threshold))
        return TaskInfo(
            TaskType.SECURE_FIT,
            ctx.job.round,
            ctx.machine.task_id(),
            ctx.model.record,
            task_config,
            secure_stage=r.stage.value,
            secure_setup=r.setup_payload(client_id),
            secure_payload=r.payload_for(client_id),
        )
