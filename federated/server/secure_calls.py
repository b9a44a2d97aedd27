"""The client calls of a secure (SecAgg+) round: its task, its stage messages, withdrawal.

RoundManager delegates to these plain functions of the manager, so rounds.py holds the
plain rounds and this file holds what a cohort member's calls do to the open SecurePhase.
The transports reach them through the RoundManager methods of the same names.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sporenet.federated.errors import StaleTaskError, quote
from sporenet.federated.secagg import ClientExcludedError, Stage
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.phases import JobStatus, Participant, TaskInfo, TaskType
from sporenet.federated.server.validation import parse_metrics

if TYPE_CHECKING:
    from sporenet.federated.server.rounds import RoundManager
    from sporenet.federated.server.secure_phase import SecurePhase


def secure_task(rm: RoundManager, client_id: str, secure: SecurePhase) -> TaskInfo:
    """A secure stage for a cohort member the protocol waits for; otherwise wait.

    The caller holds the manager's lock.
    """
    job = rm.job
    reason = secure.waiting_reason(client_id)
    if reason:
        return TaskInfo(TaskType.WAIT, job.round, retry_after=1.0, reason=reason)
    r = secure.round
    config = rm._task_config()
    if r.max_weight is not None:
        config["secure_max_weight"] = r.max_weight
    config.update(rm.privacy.task_config(r.server.params.threshold))
    return TaskInfo(
        TaskType.SECURE_FIT,
        job.round,
        rm._task_id(),
        rm._model_record,
        config,
        secure_stage=r.stage.value,
        secure_setup=r.setup_payload(client_id),
        secure_payload=r.payload_for(client_id),
    )


def submit_secure(
    rm: RoundManager,
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
    rm.touch(client_id)
    metrics = parse_metrics(metrics_json, "metrics_json")
    with rm._changed:
        secure, job, current = rm._secure, rm.job, rm._task_id()
        if (
            secure is None
            or job.status != JobStatus.RUNNING
            or task_id != current
            or not job.active
            or rm._aggregating
        ):
            why = f": {job.reason}" if job.status == JobStatus.FAILED else ""
            raise StaleTaskError(
                f"task {quote(task_id)} is not an open secure round (the server is at "
                f"{current!r}, {job.status}{why})"
            )
        if not secure.check_message(client_id, stage, current):
            return
        try:
            secure.round.submit(client_id, payload)
        except ClientExcludedError as e:
            rm._exclude_secure(secure, {client_id: e.reason})
            raise
        if secure.stage == Stage.MASKED_INPUT:
            rm._set_status(client_id, Participant.MASKED, num_samples, metrics)
            rm.metrics.inc("sporenet_updates_accepted_total")
        rm._since_checkpoint += 1
        if rm._since_checkpoint >= rm.config.checkpoint_every:
            with rm.store.transaction() as tx:
                rm._save_secure(tx)
        if not secure.round.pending():
            rm.wake.set()  # the round loop can close the stage now
    log_event(rm.log, "secure_message", client=client_id, task=task_id, stage=stage)


def withdraw_secure(rm: RoundManager, client_id: str, task_id: str) -> None:
    """The client cannot continue the secure round: stop waiting for it."""
    rm.touch(client_id)
    with rm._changed:
        secure = rm._secure
        if secure is None or task_id != rm._task_id() or client_id not in secure.cohort:
            raise StaleTaskError(f"task {quote(task_id)} is not an open secure round")
        secure.withdrawn.add(client_id)
        rm.wake.set()
    log_event(rm.log, "secure_withdrawn", logging.WARNING, client=client_id, task=task_id)
