"""Opening a job on start-up: a new job from `config.model`, or a restart's saved state.

RoundManager calls these once, from its constructor; they are plain functions of the
manager rather than methods so that rounds.py holds the running job and this file holds
how the job is rebuilt from the state dir (model version, phase, aggregate, deadline).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sporenet.federated.aggregation import template_of
from sporenet.federated.common.codec import decode_update
from sporenet.federated.errors import (
    AggregationError,
    ConfigError,
    ModelDamagedError,
    UpdateRejectedError,
)
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server import job_settings
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.phases import Participant, Phase
from sporenet.federated.server.secure_phase import SecurePhase
from sporenet.federated.server.state import JobState
from sporenet.lite import ModelFormatError, read_weights

if TYPE_CHECKING:
    from sporenet.federated.server.rounds import RoundManager


def init_job(rm: RoundManager, now: float) -> JobState:
    """Start a new job from `config.model`: model version 0 and the job row."""
    model = rm.config.model
    if model is None:
        raise ConfigError("`model` is required to start a new job (the state dir is empty)")
    try:
        data = Path(model).read_bytes()
    except OSError as e:
        raise ConfigError(f"`model`: cannot read {str(model)!r}: {e}") from None
    try:
        weights = read_weights(data, trainable_only=True)
    except ModelFormatError as e:
        raise ConfigError(f"`model` {str(model)!r} is not a valid .spore file: {e}") from None
    if not weights:
        raise ConfigError(f"`model` {str(model)!r} has no float weight tensors to train")
    record = rm.models.write(0, 0, data)
    job = JobState(waiting_since=now)
    with rm.store.transaction() as tx:
        tx.add_model(record)
        tx.set_job(job)
        tx.set_meta(job_settings.META_KEY, job_settings.job_table(rm.config))
        if rm.privacy.enabled:  # DP jobs have their accountant from the start
            tx.set_meta("privacy", rm.privacy.state())
    log_event(rm.log, "job_created", model=str(model), tensors=len(weights))
    return job


def load_model(rm: RoundManager, version: int) -> None:
    """Make model `version` the manager's current model: bytes, weights, template."""
    record = rm.store.model(version)
    if record is None:
        raise ConfigError(f"state dir {str(rm.dir)!r} lost model version {version}")
    try:
        rm._model_bytes = rm.models.read(record)
    except ModelDamagedError as e:  # the job's current model: nothing to serve or train
        raise ConfigError(str(e)) from None
    rm._model_record = record
    # Views of the model's bytes: the weights are held once (strategies return new
    # arrays; an accidental write would raise instead of corrupting them).
    try:
        rm._weights = rm._weights_reader.read(rm._model_bytes)
    except ModelFormatError as e:
        raise ConfigError(
            f"state dir {str(rm.dir)!r}: model version {version} "
            f"({str(rm.models.path(record))!r}) is unreadable: {e}"
        ) from None
    rm._template = template_of(rm._weights)
    rm.update_bytes = sum(a.nbytes for a in rm._weights.values())  # a raw update's
    rm.max_update_bytes = rm.config.max_update_bytes or 2 * rm.update_bytes + (1 << 20)
    rm._opt_state = rm.models.read_moments(version)


def check_old_models(rm: RoundManager) -> None:
    """Check every older version still on disk against its digest: a damaged one is
    logged now (and never served), not found by the first client that asks for it."""
    for record in rm.store.models():
        if record.version == rm.job.model_version or not rm.models.path(record).exists():
            continue
        try:
            rm.models.verify(record)
        except ModelDamagedError as e:
            log_event(rm.log, "model_damaged", logging.ERROR, version=record.version, reason=str(e))


def resume_phase(rm: RoundManager, now: float) -> None:
    """Rebuild the active phase after a restart: participants, aggregate, deadline."""
    job = rm.job
    rows = rm.store.participants(job.round, job.phase)
    rm.clients.restore_phase({cid: status for cid, (status, _, _) in rows.items()})
    secure = rm.store.secure_state(job.round) if job.phase == Phase.FIT else None
    if secure is not None:
        rm._secure = SecurePhase(SecureRound.from_bytes(secure))
        rm._secure.deadline = now + max(rm._stage_timeout(), rm.config.resume_grace)
        log_event(rm.log, "secure_round_restored", round=job.round, stage=rm._secure.stage.value)
    elif job.phase == Phase.FIT:
        rm._aggregator = agg = rm._make_aggregator()
        files = rm._files()
        try:
            files.restore(agg)
        except AggregationError as e:
            raise ConfigError(
                f"state dir {str(rm.dir)!r} is damaged: {e}; move that file aside and "
                "start again: the clients whose updates it held are asked for them again"
            ) from None
        folded, refolded = set(agg.clients), 0
        for cid, (status, n, _) in rows.items():
            if status != Participant.ACCEPTED or cid in folded:
                continue
            kept = files.read_kept(cid)
            update = None
            if kept is not None:
                try:
                    update = decode_update(kept, rm._template)
                except UpdateRejectedError:
                    update = None
            if update is not None:
                agg.add(cid, update, float(n))
                refolded += 1
            else:  # missing or damaged: ask the client for its update again
                log_event(
                    rm.log,
                    "kept_update_lost",
                    level=logging.WARNING,
                    client=cid,
                    file=str(files.journal_path),
                )
                rm._set_status(cid, Participant.SELECTED)
        log_event(rm.log, "aggregate_restored", checkpointed=len(folded), refolded=refolded)
    job.deadline = max(job.deadline, now + rm.config.resume_grace)
    rm._save_job()
