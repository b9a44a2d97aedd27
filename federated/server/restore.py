"""Opening a job on start-up: a new job from `config.model`, or what a restart finds.

Plain functions of the store: `new_job` writes version 0 and the job row, `resumed`
reads the state a restart continues from (the job, the open phase's participants and
its secure round) as one value, and the round manager builds its phase object from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sporenet.federated.errors import ConfigError, ModelDamagedError
from sporenet.federated.server import job_settings
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.ledger import PrivacyLedger
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.observability import log_event
from sporenet.federated.server.phase_files import PhaseFiles
from sporenet.federated.server.phases import JobStatus, Participant, Phase
from sporenet.federated.server.state import JobState, Store
from sporenet.lite import ModelFormatError, read_weights

#: (status, samples, metrics) of each participant of a phase, as stored.
Rows = dict[str, tuple[str, int, dict[str, Any]]]


@dataclass(frozen=True)
class Resumed:
    """The open phase a restart continues: its participants and its secure round."""

    rows: Rows
    secure_state: bytes | None  # a secure fit phase's SecureRound, if one is open


def new_job(
    store: Store,
    models: ModelStore,
    config: ServerConfig,
    privacy: PrivacyLedger,
    log: logging.Logger,
    now: float,
) -> JobState:
    """Start a new job from `config.model`: model version 0 and the job row.

    Raises:
        ConfigError: the model is missing, unreadable or has nothing to train.
    """
    model = config.model
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
    record = models.write(0, 0, data)
    job = JobState(waiting_since=now)
    with store.transaction() as tx:
        tx.add_model(record)
        tx.set_job(job)
        tx.set_meta(job_settings.META_KEY, job_settings.job_table(config))
        if privacy.enabled:  # DP jobs have their accountant from the start
            tx.set_meta("privacy", privacy.state())
    log_event(log, "job_created", model=str(model), tensors=len(weights))
    return job


def resumed(store: Store, job: JobState, state_dir: Path) -> Resumed | None:
    """The phase a restarted job continues (None: none is open, or the job ended). The
    rows only the phase's journal held are written to the store now, as a checkpoint
    would have (the store is where the phase's rows are read back to publish it)."""
    if job.status != JobStatus.RUNNING or not job.active:
        return None
    rows = store.participants(job.round, job.phase)
    journalled = journal_rows(state_dir, job.round, job.phase)
    if journalled:
        with store.transaction() as tx:
            for cid, (status, n, metrics) in journalled.items():
                tx.set_participant(job.round, job.phase, cid, status, n, metrics)
        rows.update(journalled)
    secure = store.secure_state(job.round) if job.phase == Phase.FIT else None
    return Resumed(rows, secure)


def journal_rows(state_dir: Path, round_: int, phase: str) -> Rows:
    """The rows of the accepted updates a phase's journal holds: the store has them only
    once a checkpoint saved them (JobContext.set_status)."""
    if phase != Phase.FIT:
        return {}
    files = PhaseFiles(state_dir, round_, phase)
    return {cid: (Participant.ACCEPTED, n, m) for cid, (n, m) in files.rows().items()}


def phase_rows(store: Store, state_dir: Path, round_: int, phase: str) -> Rows:
    """A phase's participant rows as a restart would find them: the store's, and those
    its journal holds."""
    return {**store.participants(round_, phase), **journal_rows(state_dir, round_, phase)}


def check_old_models(store: Store, models: ModelStore, current: int, log: logging.Logger) -> None:
    """Check every older version still on disk against its digest: a damaged one is
    logged now (and never served), not found by the first client that asks for it."""
    for record in store.models():
        if record.version == current or not models.path(record).exists():
            continue
        try:
            models.verify(record)
        except ModelDamagedError as e:
            log_event(log, "model_damaged", logging.ERROR, version=record.version, reason=str(e))
