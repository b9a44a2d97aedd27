"""The round state machine: who trains what, when a round closes, and publishing its model.

A job runs `rounds` rounds. Each round has a fit phase and, every `evaluate_every` rounds,
an evaluate phase. A phase is first *waiting* (not enough live clients yet), then *active*:
a sample of live clients is selected, they download the model and upload updates, which
are validated and folded into the round's aggregator as they arrive. The phase closes
when every selected client has answered (accepted, refused or dropped out) or at its
deadline; a fit phase with fewer than `min_clients` accepted updates selects replacements
instead of closing. Closing aggregates, applies the strategy and publishes the next model
version.

With `[secure_aggregation]` enabled, a fit phase holds a `SecureRound` (SecAgg+) instead of
an Aggregator: the sampled cohort is fixed when the phase starts, and the phase runs the
protocol's stages (advertise keys, share keys, masked input, unmask). A stage closes when
every client it waits for has answered, when all of those still missing have been silent
for `heartbeat_timeout` (or withdrew), or at its deadline (`round_timeout` for the
masked-input stage, where clients train; `secure_stage_timeout` for the others). The
SecureRound is saved in SQLite at every transition (and every `checkpoint_every`
messages), so a restarted server continues the stage it was in and clients resend what
it lost. Fewer than `threshold` survivors fail the round (and the job) with the
protocol's reason; the unmasked mean goes through the strategy like any aggregate.

Everything a restart needs is in the Store (one transaction per transition), the model
files, and periodic checkpoints of the aggregate; updates folded since the last
checkpoint are kept on disk and folded again after a restart. No gRPC here: the servicer
calls these methods and maps their exceptions to status codes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.federated.aggregation import Aggregator, Weights, template_of
from sporenet.federated.common.checksum import crc32
from sporenet.federated.common.codec import decode_update
from sporenet.federated.errors import (
    AggregationError,
    ConfigError,
    StaleTaskError,
    TransferError,
    UnknownClientError,
    UpdateRejectedError,
)
from sporenet.federated.privacy import (
    CentralDPAggregator,
    DistributedDP,
    PrivacyError,
    RDPAccountant,
)
from sporenet.federated.privacy.clipping import AdaptiveClipping
from sporenet.federated.secagg import SecAggError, Stage
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server.checkpoint import load_arrays, save_arrays
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.phases import JobStatus, Participant, Phase, TaskType
from sporenet.federated.server.state import JobState, ModelRecord, Store
from sporenet.federated.server.validation import validate_update
from sporenet.federated.strategies import make_strategy
from sporenet.lite import ModelFormatError, WeightsReader, read_weights, replace_weights_bytes


def transfer_split(
    max_transfers: int, *, update_bytes: int = 0, upload_memory: int = 0
) -> tuple[int, int]:
    """(download slots, upload receiving slots) out of `max_transfers`, half each; with
    `update_bytes` and `upload_memory`, no more receiving slots than that memory holds
    updates (each slot holds one in memory), one at least."""
    uploads = max(1, max_transfers // 2)
    downloads = max(1, max_transfers - uploads)
    if update_bytes > 0 and upload_memory > 0:
        uploads = max(1, min(uploads, upload_memory // update_bytes))
    return downloads, uploads


MAX_REFUSALS = 3  # a client whose update is refused this often sits out the rest of the phase
#: The secure stages that collect one message per active client.
SECURE_COLLECTING = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)


@dataclass(frozen=True)
class TaskInfo:
    """What a poll answers: the transport turns it into a `Task` message."""

    type: TaskType
    round: int = 0
    task_id: str = ""
    model: ModelRecord | None = None
    config: dict[str, Any] = field(default_factory=dict)
    retry_after: float = 1.0
    reason: str = ""
    # secure_fit only: the protocol stage, the client's RoundSetup and the stage's message.
    secure_stage: str = ""
    secure_setup: bytes = b""
    secure_payload: bytes = b""


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Replace `path` with `data` (a temporary file, then a rename: never half written)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@functools.lru_cache(maxsize=4096)  # asked for every update: once per client is enough
def file_key(client_id: str) -> str:
    """A filesystem-safe name for a client id (ids may be arbitrary configured names)."""
    return hashlib.sha256(client_id.encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=8)  # asked for every update: built once per phase
def _phase_path(state_dir: Path, round_number: int, phase: str) -> Path:
    """The directory of one phase's kept uploads (its checkpoint sits beside it)."""
    return state_dir / "rounds" / f"r{round_number:05d}-{phase}"


def _parse_metrics(text: str, what: str) -> dict[str, float]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UpdateRejectedError(f"{what} must be a JSON object of numbers: {e}") from None
    if not isinstance(value, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        for v in value.values()
    ):
        raise UpdateRejectedError(
            f"{what} must be a JSON object of finite numbers, got {text[:200]!r}"
        )
    return {str(k): float(v) for k, v in value.items()}


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

    def __init__(self, config: ServerConfig, *, metrics: Metrics, logger: logging.Logger) -> None:
        self.config = config
        self.metrics = metrics
        self.log = logger
        self.strategy = make_strategy(config.strategy, config.strategy_options)
        self.dir = Path(config.state_dir)
        for sub in ("models", "rounds", "uploads"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.store = Store(self.dir / "state.db")
        # The published model's weights, as read-only views of its bytes: each round's
        # model differs from the last only in them, so it is parsed once.
        self._weights_reader = WeightsReader()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._decode_slots = threading.BoundedSemaphore(2)  # bounds decode memory, not clients
        self._stopping = False
        self._aggregating = False
        # Set when an arrival may let the round loop act (start or close a phase) before
        # its next periodic tick. Long-polls are woken only by phase changes: waking every
        # poller on every update costs O(clients²) per round.
        self.wake = threading.Event()
        # Called (under the lock) whenever tasks may have changed, as `_changed` is notified:
        # how waiters that are not threads (the asyncio sessions) learn of it.
        self._change_listeners: list[Callable[[], None]] = []
        self._last_seen: dict[str, float] = {}
        self._parts: dict[str, str] = {}  # client id -> status in the current phase
        self._refusals: dict[str, int] = {}
        self._aggregator: Aggregator | None = None
        self._secure: SecureRound | None = None  # the open secure fit phase, if any
        self._secure_ids: frozenset[str] = frozenset()
        self._withdrawn: set[str] = set()  # cohort members that said they cannot go on
        self._stage_deadline = 0.0
        self._since_checkpoint = 0
        self._made_dirs: set[Path] = set()  # phase dirs known to exist (one mkdir per phase)
        self._phase_t0 = time.monotonic()

        now = time.time()
        job = self.store.job()
        self._init_privacy(job)  # before a new job is written: they are saved together
        if job is None:
            job = self._init_job(now)
        else:
            log_event(self.log, "job_resumed", round=job.round, phase=job.phase, status=job.status)
        self.job = job
        with self.store.transaction() as tx:
            tx.set_meta("config", _config_summary(config))
        self._load_model(job.model_version)
        self._check_distributed_range()
        for cid in self.store.clients():
            self._last_seen[cid] = now  # everyone gets a heartbeat_timeout to come back
        if job.status == JobStatus.RUNNING and job.active:
            self._resume_phase(now)
        self.metrics.set("sporenet_current_round", job.round)
        self.metrics.set("sporenet_clients_registered", len(self._last_seen))

    # -- setup ----------------------------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (quick, never blocking) whenever clients' tasks may have changed."""
        with self._lock:
            self._change_listeners.append(listener)

    def _wake_if_settled(self) -> None:
        """Wake the round loop once no selected client is left to report (call it under
        the lock): only then can an arrival close the phase early; deadlines and dropouts
        it checks on its own ticks. Waking it for every update cost a thread switch and a
        scan of all participants per update: O(clients^2) per round."""
        if Participant.SELECTED not in self._parts.values():
            self.wake.set()

    def _notify_changed(self) -> None:
        self._changed.notify_all()
        for listener in self._change_listeners:
            listener()

    @property
    def stopping(self) -> bool:
        """True once `stop()` was called: held polls should answer now."""
        return self._stopping

    def _init_job(self, now: float) -> JobState:
        if self.config.model is None:
            raise ConfigError("`model` is required to start a new job (the state dir is empty)")
        try:
            data = Path(self.config.model).read_bytes()
        except OSError as e:
            raise ConfigError(f"`model`: cannot read {str(self.config.model)!r}: {e}") from None
        try:
            weights = read_weights(data)
        except ModelFormatError as e:
            raise ConfigError(
                f"`model` {str(self.config.model)!r} is not a valid .spore file: {e}"
            ) from None
        if not weights:
            raise ConfigError(
                f"`model` {str(self.config.model)!r} has no float weight tensors to train"
            )
        record = self._write_model(0, 0, data)
        job = JobState(waiting_since=now)
        with self.store.transaction() as tx:
            tx.add_model(record)
            tx.set_job(job)
            if self._accountant is not None:  # DP jobs have their accountant from the start
                tx.set_meta("privacy", self._privacy_state())
        log_event(self.log, "job_created", model=str(self.config.model), tensors=len(weights))
        return job

    def _init_privacy(self, job: JobState | None) -> None:
        """The accountant and adaptive clipping norm: restored from the store, or fresh."""
        dp = self.config.differential_privacy
        self._accountant: RDPAccountant | None = None
        self._adaptive: AdaptiveClipping | None = None
        self._privacy_rounds: list[dict[str, Any]] = []
        if dp is None:
            return
        saved = self.store.get_meta("privacy")
        # delta and the budget are the configuration's; what was spent is the store's.
        settings: dict[str, Any] = {"delta": dp.delta, "epsilon_budget": dp.epsilon_budget}
        if saved is None:
            if job is not None:
                # Rounds already released (or under way) without noise: no epsilon is true.
                raise ConfigError(
                    "`differential_privacy` cannot be enabled for a job that started without"
                    f" it (state dir {str(self.dir)!r} is at round {job.round}): its"
                    " epsilon would not cover the earlier rounds; start a new state dir"
                )
            self._accountant = RDPAccountant(**settings)
            self._adaptive = dp.adaptive()  # saved with the new job (_init_job)
        else:
            if not isinstance(saved, dict) or not isinstance(saved.get("accountant"), dict):
                raise ConfigError(
                    f"state dir {str(self.dir)!r}: the saved privacy state is malformed"
                )
            self._accountant = RDPAccountant.from_dict({**saved["accountant"], **settings})
            self._adaptive = (
                AdaptiveClipping.from_dict(saved["adaptive"])
                if dp.adaptive_clipping and saved.get("adaptive")
                else dp.adaptive()
            )
            self._privacy_rounds = list(saved.get("rounds", []))
            self.metrics.set("sporenet_privacy_epsilon", self._accountant.epsilon())
            log_event(
                self.log,
                "privacy_restored",
                rounds=self._accountant.rounds,
                epsilon=self._accountant.epsilon(),
            )

    def _dp_task_config(self, threshold: int = 0) -> dict[str, Any]:
        """What a client must do for client-side DP (the SDK reads these `dp_*` keys)."""
        dp = self.config.differential_privacy
        if dp is None or dp.mode == "central":
            return {}
        if dp.mode == "local":  # the client adds all of the noise
            return {
                "dp_local_noise_multiplier": dp.noise_multiplier,
                "dp_clipping_norm": dp.clipping_norm,
            }
        # distributed: clip and add N(0, (zC)²/t); any t contributors carry (zC)² in sum.
        return {
            "dp_noise_multiplier": dp.noise_multiplier,
            "dp_clipping_norm": dp.clipping_norm,
            "dp_min_clients": threshold,
        }

    def _charged_rate(self, sample_rate: float) -> float:
        """The sampling rate the accountant charges: local DP protects each release on its
        own (the server knows who was sampled), so it gets no amplification."""
        dp = self.config.differential_privacy
        return 1.0 if dp is not None and dp.mode == "local" else sample_rate

    def _check_distributed_range(self) -> None:
        """Distributed DP's noised coordinates must fit secagg's clipping range (else the
        clipped noise is no longer Gaussian): checked once the model's size is known."""
        dp, sa = self.config.differential_privacy, self.config.secure_aggregation
        if dp is None or dp.mode != "distributed" or sa is None:
            return
        # The smallest cohort has the smallest threshold, hence the largest noise share.
        t = sa.resolve(self.config.min_clients).threshold
        share = DistributedDP(
            noise_multiplier=dp.noise_multiplier, clipping_norm=dp.clipping_norm, min_clients=t
        )
        size = sum(int(np.prod(shape)) for shape, _ in self._template.values())
        need = share.suggested_clipping_range(size)
        if sa.clipping_range < need:
            raise ConfigError(
                f"`secure_aggregation.clipping_range` must be >= {need:.4g} with distributed DP"
                f" (clipping_norm {dp.clipping_norm:g} plus the tail of each client's noise,"
                f" std {share.client_noise_std:.4g} at threshold {t}, over {size} coordinates),"
                f" got {sa.clipping_range:g}"
            )

    def _privacy_state(self) -> dict[str, Any]:
        """What the store keeps about privacy (JSON); `status` shows it."""
        accountant = self._accountant
        if accountant is None:  # a job without differential privacy has nothing to report
            return {}
        dp = self.config.differential_privacy
        return {
            "mode": dp.mode if dp is not None else "",
            "epsilon": accountant.epsilon(),
            "delta": accountant.delta,
            "epsilon_budget": accountant.epsilon_budget,
            "rounds": self._privacy_rounds,
            "accountant": accountant.to_dict(),
            "adaptive": self._adaptive.to_dict() if self._adaptive is not None else None,
        }

    def _make_aggregator(self) -> Aggregator:
        """The fit phase's aggregator: the strategy's, or the central-DP clipped noised mean."""
        dp = self.config.differential_privacy
        if dp is None or dp.mode != "central":
            return self.strategy.make_aggregator(self._template)
        # Noise comes from the OS, never from the job's seed: predictable noise protects nothing.
        return CentralDPAggregator(
            self._template,
            noise_multiplier=dp.noise_multiplier,
            expected_clients=max(self.job.dp_cohort, 1),
            clipping_norm=None if self._adaptive is not None else dp.clipping_norm,
            adaptive=self._adaptive,
        )

    def _budget_left(self, sample_rate: float) -> str:
        """Why the job must stop before a fit round at `sample_rate` ("" if it fits the budget)."""
        dp, acc = self.config.differential_privacy, self._accountant
        if dp is None or acc is None or acc.epsilon_budget is None:
            return ""
        if acc.can_spend(noise_multiplier=dp.noise_multiplier, sample_rate=sample_rate):
            return ""
        after = acc.epsilon_after(noise_multiplier=dp.noise_multiplier, sample_rate=sample_rate)
        return (
            f"privacy budget reached after {acc.rounds} round(s): epsilon={acc.epsilon():.4f}"
            f" at delta={acc.delta:g}; one more round would reach {after:.4f}, over"
            f" epsilon_budget={acc.epsilon_budget:g}"
        )

    def _finish_for_budget(self, why: str) -> None:
        """End the job cleanly (finished, not failed): the next round would overspend."""
        job = self.job
        job.status, job.reason, job.active = JobStatus.FINISHED, why, False
        self._save_job()
        log_event(self.log, "job_finished", reason=why, model_version=job.model_version)
        self._notify_changed()

    def _write_model(self, version: int, round_: int, data: bytes) -> ModelRecord:
        name = f"models/v{version:05d}.spore"
        write_atomic(self.dir / name, data)
        return ModelRecord(
            version, round_, name, hashlib.sha256(data).hexdigest(), len(data), crc32(data)
        )

    def _load_model(self, version: int) -> None:
        record = self.store.model(version)
        if record is None:
            raise ConfigError(f"state dir {str(self.dir)!r} lost model version {version}")
        self._model_bytes = (self.dir / record.file).read_bytes()
        record.crc32 = crc32(self._model_bytes)  # not stored: a restart computes it again
        self._model_record = record
        # Views of the model's bytes: the weights are held once (strategies return new
        # arrays; an accidental write would raise instead of corrupting them).
        self._weights = self._weights_reader.read(self._model_bytes)
        self._template = template_of(self._weights)
        self.update_bytes = sum(a.nbytes for a in self._weights.values())  # a raw update's
        self.max_update_bytes = self.config.max_update_bytes or 2 * self.update_bytes + (1 << 20)
        opt = self.dir / f"models/v{version:05d}.opt.npz"
        self._opt_state: dict[str, np.ndarray] = {}
        if opt.exists():
            with np.load(opt, allow_pickle=False) as z:
                self._opt_state = {k: z[k] for k in z.files}

    def _phase_dir(self) -> Path:
        return _phase_path(self.dir, self.job.round, self.job.phase)

    def _checkpoint_path(self) -> Path:
        return self._phase_dir().with_suffix(".ckpt")

    def _resume_phase(self, now: float) -> None:
        """Rebuild the active phase after a restart: participants, aggregate, deadline."""
        rows = self.store.participants(self.job.round, self.job.phase)
        self._parts = {cid: status for cid, (status, _, _) in rows.items()}
        secure = self.store.secure_state(self.job.round) if self.job.phase == Phase.FIT else None
        if secure is not None:
            self._set_secure(SecureRound.from_bytes(secure))
            self._stage_deadline = now + max(self._stage_timeout(), self.config.resume_grace)
            log_event(
                self.log,
                "secure_round_restored",
                round=self.job.round,
                stage=self._secure.stage.value if self._secure else "",
            )
        elif self.job.phase == "fit":
            agg = self._make_aggregator()
            ckpt = self._checkpoint_path()
            if ckpt.exists():
                agg.restore(load_arrays(ckpt))
            folded = set(agg.clients)
            refolded = 0
            for cid, (status, n, _) in rows.items():
                if status != Participant.ACCEPTED or cid in folded:
                    continue
                kept = self._phase_dir() / f"{file_key(cid)}.upd"
                if kept.exists():
                    agg.add(cid, decode_update(kept.read_bytes(), self._template), float(n))
                    refolded += 1
                else:  # should not happen; ask the client for its update again
                    self._parts[cid] = Participant.SELECTED
                    with self.store.transaction() as tx:
                        tx.set_participant(
                            self.job.round, self.job.phase, cid, Participant.SELECTED
                        )
            self._aggregator = agg
            log_event(self.log, "aggregate_restored", checkpointed=len(folded), refolded=refolded)
        self.job.deadline = max(self.job.deadline, now + self.config.resume_grace)
        self._save_job()

    def _set_secure(self, secure: SecureRound | None) -> None:
        self._secure = secure
        self._secure_ids = frozenset(secure.client_ids) if secure is not None else frozenset()
        self._withdrawn = set()

    def _stage_timeout(self) -> float:
        """The open secure stage's deadline: local training happens in the masked-input
        stage, so that one gets `round_timeout`; the key and share exchanges are quick."""
        if self._secure is not None and self._secure.stage == Stage.MASKED_INPUT:
            return self.config.round_timeout
        return self.config.secure_stage_timeout

    def _save_secure(self, tx: Any) -> None:
        """Persist the open SecureRound (inside the caller's transaction)."""
        if self._secure is not None:
            tx.set_secure_state(self.job.round, self._secure.to_bytes())
        self._since_checkpoint = 0

    def _save_job(self) -> None:
        with self.store.transaction() as tx:
            tx.set_job(self.job)

    # -- client-facing --------------------------------------------------------------------

    def register(self, name: str, identity: str | None, info: dict[str, str]) -> str:
        """The client's id: its authenticated identity, else its chosen name, else a new one."""
        client_id = identity or name or f"client-{os.urandom(6).hex()}"
        with self._changed:
            new = client_id not in self._last_seen
            with self.store.transaction() as tx:
                tx.add_client(client_id, name or client_id, info)
            self._last_seen[client_id] = time.time()
            self.metrics.set("sporenet_clients_registered", len(self._last_seen))
            self.wake.set()  # pollers' tasks are unchanged; the round loop may act
        if new:
            log_event(self.log, "client_registered", client=client_id)
        return client_id

    def touch(self, client_id: str) -> None:
        """Mark the client alive; raises UnknownClientError for ids never registered."""
        with self._lock:
            if client_id not in self._last_seen:
                raise UnknownClientError(
                    f"client {client_id!r} is not registered; call Register first"
                )
            self._last_seen[client_id] = time.time()

    def _task_id(self) -> str:
        """The open phase's task id; a secure round run again gets a new one, so clients
        start fresh secure sessions instead of answering with the failed run's keys."""
        return f"r{self.job.round}-{self.job.phase}{self._secure_run()}"

    def _secure_run(self) -> str:
        """Names a run of a secure round after its first (the task id, the cohort's seed)."""
        return f"-s{self.job.secure_attempt}" if self.job.secure_attempt else ""

    def _current_task(self, client_id: str) -> TaskInfo:
        job = self.job
        if job.status != "running":
            return TaskInfo(
                TaskType.DONE,
                job.round,
                model=self._model_record,
                reason=job.reason or job.status,
            )
        if job.active and not self._aggregating and self._secure is not None:
            return self._secure_task(client_id)
        if job.active and not self._aggregating and self._parts.get(client_id) == "selected":
            config = {"round": job.round, "rounds": self.config.rounds, **self.config.fit_config}
            if job.phase == "fit":
                config.update(self.strategy.fit_config(job.round))
                config.update(self._dp_task_config())
            return TaskInfo(
                TaskType(job.phase), job.round, self._task_id(), self._model_record, config
            )
        return TaskInfo(
            TaskType.WAIT,
            job.round,
            retry_after=1.0,
            reason="not selected" if job.active else "waiting",
        )

    def _secure_task(self, client_id: str) -> TaskInfo:
        """A secure stage for a cohort member the protocol waits for; otherwise wait."""
        r, job = self._secure, self.job
        if (
            r is None
            or client_id not in self._secure_ids
            or client_id in self._withdrawn
            or r.stage not in SECURE_COLLECTING
        ):
            return TaskInfo(TaskType.WAIT, job.round, retry_after=1.0, reason="not selected")
        if not r.expects(client_id):
            return TaskInfo(TaskType.WAIT, job.round, retry_after=1.0, reason="next secure stage")
        config = {
            "round": job.round,
            "rounds": self.config.rounds,
            **self.config.fit_config,
            **self.strategy.fit_config(job.round),
        }
        if r.max_weight is not None:
            config["secure_max_weight"] = r.max_weight
        config.update(self._dp_task_config(r.server.params.threshold))
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
        """The client's task now (the Session service holds a poll until it changes)."""
        self.touch(client_id)
        with self._lock:
            return self._current_task(client_id)

    def heartbeat(self, client_id: str, task_id: str) -> bool:
        """Mark alive; True while `task_id` is still wanted from this client."""
        self.touch(client_id)
        with self._lock:
            if self._secure is not None:
                return (
                    self.job.status == JobStatus.RUNNING
                    and task_id == self._task_id()
                    and client_id in self._secure_ids
                    and self._secure.stage in SECURE_COLLECTING
                )
            return (
                self.job.status == JobStatus.RUNNING
                and task_id == self._task_id()
                and self.job.active
                and not self._aggregating
                and self._parts.get(client_id) == Participant.SELECTED
            )

    def transfer_slots(self) -> tuple[int, int]:
        """(download slots, upload receiving slots) for this job's model: `max_transfers`
        split in half, with no more receiving slots than `max_upload_memory` holds."""
        return transfer_split(
            self.config.max_transfers,
            update_bytes=self.update_bytes,
            upload_memory=self.config.max_upload_memory,
        )

    def model_record(self, version: int) -> ModelRecord:
        record = self.store.model(version)
        if record is None:
            raise StaleTaskError(
                f"model version {version} does not exist (latest is {self.job.model_version})"
            )
        return record

    def model_path(self, record: ModelRecord) -> Path:
        return self.dir / record.file

    def upload_path(self, client_id: str, upload_id: str) -> Path:
        return self.dir / "uploads" / f"{file_key(client_id)}-{upload_id}.part"

    def open_upload(self, client_id: str, task_id: str, total_size: int) -> bool:
        """Check an upload may start; False when this task's update was already accepted."""
        self.touch(client_id)
        with self._lock:
            status = self._parts.get(client_id)
            if task_id == self._task_id() and self.job.phase == Phase.FIT and status == "accepted":
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

    def _check_open(self, client_id: str, task_id: str, phase: str) -> None:
        current = self._task_id()
        if (
            self.job.status != JobStatus.RUNNING
            or task_id != current
            or not self.job.active
            or self.job.phase != phase
        ):
            raise StaleTaskError(
                f"task {task_id!r} is not open (the server is at {current!r}, {self.job.status})"
            )
        if self._aggregating:
            raise StaleTaskError(f"task {task_id!r} closed: the round is being aggregated")
        if self._secure is not None:
            raise StaleTaskError(
                f"round {task_id!r} is a secure round: plain updates are refused (the client"
                " answers TASK_SECURE_FIT stages with SubmitSecure)"
            )
        status = self._parts.get(client_id)
        if status != "selected":
            raise StaleTaskError(
                f"client {client_id!r} has no open task in {current!r} (status {status})"
            )

    def refuse(self, client_id: str, error: UpdateRejectedError) -> None:
        """Count a refused update against the client, then raise `error`."""
        self.metrics.inc("sporenet_updates_rejected_total")
        with self._changed:
            count = self._refusals.get(client_id, 0) + 1
            self._refusals[client_id] = count
            if count >= MAX_REFUSALS and self._parts.get(client_id) == "selected":
                self._parts[client_id] = Participant.REJECTED
                with self.store.transaction() as tx:
                    tx.set_participant(
                        self.job.round, self.job.phase, client_id, Participant.REJECTED
                    )
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

        `payload` is the update's bytes, `mismatch` why they do not match the checksum in
        the upload header ('' when they do: see checksum.update_mismatch), and `upload` the
        path of its partial file, if one was kept (removed once used). The decoded tensors
        are views of `payload`: nothing is copied before the fold. Before the update counts,
        its bytes are written to the phase directory, so an accepted update survives a
        `kill -9` until the next checkpoint contains it.
        """
        # The slot is held until the update is folded: at most two decoded updates exist at
        # any time, however many clients upload at once (memory flat in the fleet size).
        with self._decode_slots:
            try:
                metrics = _parse_metrics(metrics_json, "metrics_json")
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
            phase_dir = self._phase_dir()
            kept = phase_dir / f"{file_key(client_id)}.upd"
            tmp: Path | None = kept.with_name(f"{kept.name}.{threading.get_ident()}.tmp")
            if phase_dir not in self._made_dirs:
                phase_dir.mkdir(parents=True, exist_ok=True)
                self._made_dirs = {phase_dir}
            with open(tmp, "wb") as f:  # outside the lock: other uploads fold meanwhile
                f.write(payload)
            try:
                with self._changed:
                    self._check_open(client_id, task_id, Phase.FIT)
                    if self._aggregator is None:  # cannot happen while a fit phase is open
                        raise AggregationError("no aggregator for the open fit phase")
                    self._aggregator.add(client_id, update, float(num_samples))
                    os.replace(tmp, kept)
                    tmp = None
                    self._parts[client_id] = Participant.ACCEPTED
                    with self.store.transaction() as tx:
                        tx.set_participant(
                            self.job.round,
                            Phase.FIT,
                            client_id,
                            Participant.ACCEPTED,
                            num_samples,
                            metrics,
                        )
                    self._since_checkpoint += 1
                    if self._since_checkpoint >= self.config.checkpoint_every:
                        self._checkpoint()
                    self.metrics.inc("sporenet_updates_accepted_total")
                    self._wake_if_settled()
            finally:
                del update
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
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
        if self._aggregator is None:
            return
        save_arrays(self._checkpoint_path(), self._aggregator.snapshot())
        for cid in self._aggregator.clients:
            (self._phase_dir() / f"{file_key(cid)}.upd").unlink(missing_ok=True)
        self._since_checkpoint = 0

    def report_evaluation(
        self, client_id: str, task_id: str, *, loss: float, num_samples: int, metrics_json: str
    ) -> None:
        """Record one evaluation result."""
        self.touch(client_id)
        metrics = _parse_metrics(metrics_json, "metrics_json")
        if not math.isfinite(loss) or num_samples <= 0:
            raise UpdateRejectedError(
                f"evaluation needs a finite loss and num_samples > 0, got {loss}, {num_samples}"
            )
        with self._changed:
            self._check_open(client_id, task_id, Phase.EVALUATE)
            self._parts[client_id] = Participant.ACCEPTED
            with self.store.transaction() as tx:
                tx.set_participant(
                    self.job.round,
                    Phase.EVALUATE,
                    client_id,
                    Participant.ACCEPTED,
                    num_samples,
                    {"loss": loss, **metrics},
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
        """Record one client message of the open secure stage (a resent one is a no-op)."""
        self.touch(client_id)
        metrics = _parse_metrics(metrics_json, "metrics_json")
        with self._changed:
            r = self._secure
            current = self._task_id()
            if (
                r is None
                or self.job.status != JobStatus.RUNNING
                or task_id != current
                or not self.job.active
                or self._aggregating
            ):
                why = f": {self.job.reason}" if self.job.status == JobStatus.FAILED else ""
                raise StaleTaskError(
                    f"task {task_id!r} is not an open secure round (the server is at "
                    f"{current!r}, {self.job.status}{why})"
                )
            if stage != r.stage.value:
                raise StaleTaskError(
                    f"secure stage {stage!r} is closed; the round is at {r.stage.value!r}"
                )
            if client_id not in self._secure_ids:
                raise StaleTaskError(f"client {client_id!r} is not in the secure round {current!r}")
            if not r.expects(client_id):
                if r.index_of(client_id) in r.server.active_clients():
                    return  # already recorded: the client retried after a lost reply
                raise StaleTaskError(
                    f"client {client_id!r} was left out of secure round {current!r} "
                    f"(it missed an earlier stage)"
                )
            r.submit(client_id, payload)
            if r.stage == Stage.MASKED_INPUT:
                with self.store.transaction() as tx:
                    tx.set_participant(
                        self.job.round,
                        Phase.FIT,
                        client_id,
                        Participant.MASKED,
                        num_samples,
                        metrics,
                    )
                self._parts[client_id] = Participant.MASKED
                self.metrics.inc("sporenet_updates_accepted_total")
            self._since_checkpoint += 1
            if self._since_checkpoint >= self.config.checkpoint_every:
                with self.store.transaction() as tx:
                    self._save_secure(tx)
            if not r.pending():
                self.wake.set()  # the round loop can close the stage now
        log_event(self.log, "secure_message", client=client_id, task=task_id, stage=stage)

    def withdraw_secure(self, client_id: str, task_id: str) -> None:
        """The client cannot continue the secure round: stop waiting for it."""
        self.touch(client_id)
        with self._changed:
            if (
                self._secure is None
                or task_id != self._task_id()
                or client_id not in self._secure_ids
            ):
                raise StaleTaskError(f"task {task_id!r} is not an open secure round")
            self._withdrawn.add(client_id)
            self.wake.set()
        log_event(self.log, "secure_withdrawn", logging.WARNING, client=client_id, task=task_id)

    # -- the round loop ---------------------------------------------------------------------

    def stop(self) -> None:
        """Wake every long-poll so in-flight calls can finish; persists the job."""
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
        cutoff = now - self.config.heartbeat_timeout
        return sorted(c for c, t in self._last_seen.items() if t >= cutoff)

    def tick(self) -> None:
        """Advance the state machine by whatever time and arrivals allow (called ~4×/s)."""
        now = time.time()
        with self._changed:
            job = self.job
            if job.status != JobStatus.RUNNING or self._aggregating or self._stopping:
                return
            if not job.active:
                self._try_start(now)
                return
            if job.phase == Phase.FIT and self._secure is not None:
                if not self._advance_secure(now):
                    return
                self._aggregating = True
            else:
                self._drop_silent(now)
                pending = sum(1 for s in self._parts.values() if s == Participant.SELECTED)
                accepted = sum(1 for s in self._parts.values() if s == Participant.ACCEPTED)
                if job.phase == "fit":
                    if accepted >= self.config.min_clients and (
                        pending == 0 or now >= job.deadline
                    ):
                        self._aggregating = True
                    elif pending == 0 or now >= job.deadline:
                        self._reselect(now, accepted, pending)
                        return
                    else:
                        return
                elif pending == 0 or now >= job.deadline:
                    self._aggregating = True
                else:
                    return
            self._notify_changed()
        # Aggregation and publishing run outside the lock: heartbeats and polls keep flowing.
        try:
            if self.job.phase == "fit":
                self._publish_fit()
            else:
                self._finish_evaluate()
        finally:
            with self._changed:
                self._aggregating = False
                self._notify_changed()

    def _advance_secure(self, now: float) -> bool:
        """Close the secure stage when it may close; True once the round has its sum."""
        r, job = self._secure, self.job
        if r is None:
            return False
        if r.stage == Stage.COMPLETED:  # restarted between the last stage and publishing
            return True
        pending = r.pending()
        cutoff = now - self.config.heartbeat_timeout
        silent = all(c in self._withdrawn or self._last_seen.get(c, 0.0) < cutoff for c in pending)
        if pending and not silent and now < self._stage_deadline:
            return False
        closing = r.stage.value
        try:
            r.close_stage()
        except SecAggError as e:
            self.metrics.inc("sporenet_rounds_failed_total")
            if job.secure_attempt < self.config.secure_retries:
                self._retry_secure(now, e)
                return False
            job.status = JobStatus.FAILED
            job.reason = f"round {job.round}: secure aggregation failed: {e}"
            with self.store.transaction() as tx:
                self._save_secure(tx)
                tx.set_job(job)
            log_event(self.log, "job_failed", logging.ERROR, reason=job.reason)
            self._notify_changed()
            return False
        self._stage_deadline = now + self._stage_timeout()
        with self.store.transaction() as tx:
            self._save_secure(tx)
            for cid in pending:
                if self._parts.get(cid) in (Participant.SELECTED, Participant.MASKED):
                    self._parts[cid] = Participant.DROPPED
                    tx.set_participant(job.round, Phase.FIT, cid, Participant.DROPPED)
        if pending:
            self.metrics.inc("sporenet_clients_dropped_total", len(pending))
        log_event(
            self.log,
            "secure_stage_closed",
            round=job.round,
            stage=closing,
            next=r.stage.value,
            missing=pending,
        )
        self._notify_changed()
        return r.stage == Stage.COMPLETED

    def _retry_secure(self, now: float, error: SecAggError) -> None:
        """Give up this run of the secure round (nothing of it can be unmasked) and go back
        to waiting: the next tick samples a new cohort from the clients then live."""
        job = self.job
        job.secure_attempt += 1
        job.active, job.attempt, job.waiting_since = False, 0, now
        left = [c for c, s in self._parts.items() if s != Participant.DROPPED]
        self._set_secure(None)
        with self.store.transaction() as tx:
            self._save_secure(tx)
            for cid in left:
                tx.set_participant(job.round, Phase.FIT, cid, Participant.ABANDONED)
            tx.set_job(job)
        self._parts, self._refusals = {}, {}
        log_event(
            self.log,
            "secure_round_retried",
            logging.WARNING,
            round=job.round,
            attempt=job.secure_attempt,
            of=self.config.secure_retries,
            reason=str(error),
        )
        self._notify_changed()

    def _drop_silent(self, now: float) -> None:
        cutoff = now - self.config.heartbeat_timeout
        dropped = [
            c
            for c, s in self._parts.items()
            if s == Participant.SELECTED and self._last_seen.get(c, 0) < cutoff
        ]
        if not dropped:
            return
        with self.store.transaction() as tx:
            for cid in dropped:
                self._parts[cid] = Participant.DROPPED
                tx.set_participant(self.job.round, self.job.phase, cid, Participant.DROPPED)
        self.metrics.inc("sporenet_clients_dropped_total", len(dropped))
        log_event(
            self.log, "clients_dropped", logging.WARNING, round=self.job.round, clients=dropped
        )

    def _try_start(self, now: float) -> None:
        job = self.job
        live = self._live_clients(now)
        need = (
            max(self.config.min_clients, self.config.min_available) if job.phase == Phase.FIT else 1
        )
        if len(live) < need:
            if self.config.wait_timeout and now - job.waiting_since > self.config.wait_timeout:
                job.status = JobStatus.FAILED
                job.reason = (
                    f"only {len(live)} of min_clients={need} clients connected within "
                    f"wait_timeout={self.config.wait_timeout:g} s"
                )
                self._save_job()
                log_event(self.log, "job_failed", logging.ERROR, reason=job.reason)
                self._notify_changed()
            return
        fraction = self.config.fraction if job.phase == Phase.FIT else self.config.evaluate_fraction
        size = min(len(live), max(need, math.ceil(fraction * len(live))))
        if job.phase == Phase.FIT and self.config.differential_privacy is not None:
            rate = self._charged_rate(size / len(live))
            why = self._budget_left(rate)
            if why:
                self._finish_for_budget(why)
                return
            job.dp_cohort, job.dp_sample_rate = size, rate
        rng = random.Random(f"{self.config.seed}-{job.round}-{job.phase}{self._secure_run()}")
        chosen = sorted(rng.sample(live, size))
        job.active, job.attempt = True, 0
        job.phase_started, job.deadline = now, now + self.config.round_timeout
        self._parts = dict.fromkeys(chosen, Participant.SELECTED)
        self._refusals = {}
        self._since_checkpoint = 0
        self._phase_t0 = time.monotonic()
        secure = None
        if job.phase == Phase.FIT and self.config.secure_aggregation is not None:
            try:
                secure = SecureRound.start(
                    self.config.secure_aggregation,
                    client_ids=chosen,
                    template=self._template,
                    max_weight=self.config.secure_max_weight,
                )
            except SecAggError as e:
                job.active = False
                job.status = JobStatus.FAILED
                job.reason = f"round {job.round}: secure aggregation cannot start: {e}"
                self._save_job()
                log_event(self.log, "job_failed", logging.ERROR, reason=job.reason)
                self._notify_changed()
                return
        elif job.phase == "fit":
            self._aggregator = self._make_aggregator()
        self._set_secure(secure)
        self._stage_deadline = now + self._stage_timeout()
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
        spare = [c for c in self._live_clients(now) if c not in self._parts]
        extra = sorted(
            random.Random(f"{self.config.seed}-{job.round}-{job.attempt}").sample(
                spare, min(len(spare), max(missing, 0))
            )
        )
        if now >= job.deadline:
            job.attempt += 1
            job.deadline = now + self.config.round_timeout
        elif not extra:
            return  # nobody to ask yet; the deadline decides
        with self.store.transaction() as tx:
            for cid in extra:
                self._parts[cid] = Participant.SELECTED
                tx.set_participant(job.round, job.phase, cid, Participant.SELECTED)
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

    def _publish_fit(self) -> None:
        job, t0 = self.job, time.monotonic()
        try:
            secure_info: dict[str, Any] = {}
            clip: float | None = None
            if self._secure is not None:
                delta, contributors = self._secure.result()
                secure_info = {"secure_error_bound": self._secure.server.result().error_bound}
                self._mark_contributors(contributors)
            elif self._aggregator is None:  # cannot happen: set whenever a fit phase is active
                raise AggregationError("no aggregator for the fit phase")
            else:
                # Read before result(): adaptive clipping moves the norm for the next round.
                clip = getattr(self._aggregator, "clipping_norm", None)
                delta = self._aggregator.result()
            new_weights, new_state = self.strategy.apply(self._weights, delta, self._opt_state)
            del delta  # large models: hold at most the sums, the new weights and their bytes
            privacy_info = self._spend_privacy(clip)
        except (AggregationError, SecAggError, PrivacyError) as e:
            with self._changed:
                job.status, job.reason = JobStatus.FAILED, f"round {job.round}: {e}"
                self._save_job()
            log_event(self.log, "job_failed", logging.ERROR, reason=job.reason)
            return
        data = replace_weights_bytes(self._model_bytes, new_weights)
        del new_weights  # they are in `data` now: hold them once
        version = job.model_version + 1
        record = self._write_model(version, job.round, data)
        if new_state:
            tmp = self.dir / f"models/v{version:05d}.opt.tmp.npz"
            np.savez(tmp, **new_state)  # type: ignore[arg-type]  # numpy types **kwds as bool
            os.replace(tmp, self.dir / f"models/v{version:05d}.opt.npz")
        rows = self.store.participants(job.round, Phase.FIT)
        accepted = [(n, m) for (s, n, m) in rows.values() if s == Participant.ACCEPTED]
        summary = weighted_metrics(accepted)
        summary["num_samples"] = float(sum(n for n, _ in accepted))
        phase_dir, ckpt = self._phase_dir(), self._checkpoint_path()
        with self._changed:
            with self.store.transaction() as tx:
                tx.add_model(record)
                tx.finish_round(job.round, Phase.FIT, len(accepted), summary)
                tx.delete_secure_state(job.round)
                if privacy_info:  # what this round spent, with the round it paid for
                    tx.set_meta("privacy", self._privacy_state())
                job.model_version = version
                self._advance(
                    tx,
                    evaluate_next=bool(self.config.evaluate_every)
                    and job.round % self.config.evaluate_every == 0,
                )
            # Stop now if even the smallest sampling rate a round can have is unaffordable.
            # (After an evaluate phase, the next fit phase's start checks instead.)
            running_fit = job.status == JobStatus.RUNNING and job.phase == Phase.FIT
            why = self._budget_left(self._charged_rate(self.config.fraction)) if running_fit else ""
            if why:
                self._finish_for_budget(why)
            self._model_bytes, self._opt_state = data, new_state
            self._weights = self._weights_reader.read(data)
            self._model_record = record
            self._aggregator = None
            self._set_secure(None)
        shutil.rmtree(phase_dir, ignore_errors=True)
        ckpt.unlink(missing_ok=True)
        took = time.monotonic() - t0
        self.metrics.inc("sporenet_rounds_completed_total")
        self.metrics.set("sporenet_aggregation_seconds", took)
        self.metrics.set("sporenet_round_duration_seconds", time.monotonic() - self._phase_t0)
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
        """Charge the published round to the accountant; its epsilon etc. for the log."""
        dp, acc, job = self.config.differential_privacy, self._accountant, self.job
        if dp is None or acc is None:
            return {}
        q = job.dp_sample_rate
        # The budget was checked when the round started; a round released is always paid.
        before = acc.epsilon_budget
        acc.epsilon_budget = None
        try:
            eps = acc.spend(noise_multiplier=dp.noise_multiplier, sample_rate=q)
        finally:
            acc.epsilon_budget = before
        entry = {
            "round": job.round,
            "epsilon": eps,
            "sample_rate": q,
            "cohort": job.dp_cohort,
            "noise_multiplier": dp.noise_multiplier,
            "clipping_norm": clipping_norm if clipping_norm is not None else dp.clipping_norm,
        }
        self._privacy_rounds.append(entry)
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

    def _mark_contributors(self, contributors: Sequence[str]) -> None:
        """After a secure round: contributors are accepted, the rest of the cohort dropped."""
        rows = self.store.participants(self.job.round, Phase.FIT)
        done = set(contributors)
        with self._changed, self.store.transaction() as tx:
            for cid in self._secure_ids:
                _, n, m = rows.get(cid, ("", 0, {}))
                status = Participant.ACCEPTED if cid in done else Participant.DROPPED
                self._parts[cid] = status
                tx.set_participant(self.job.round, Phase.FIT, cid, status, n, m)

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
                job.status, job.reason = JobStatus.FINISHED, f"all {self.config.rounds} rounds done"
        job.active, job.attempt, job.waiting_since = False, 0, time.time()
        job.secure_attempt = 0
        self._parts, self._refusals = {}, {}
        tx.set_job(job)
        if job.status == "finished":
            log_event(
                self.log, "job_finished", rounds=self.config.rounds, model_version=job.model_version
            )

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            counts: dict[str, int] = {}
            for s in self._parts.values():
                counts[s] = counts.get(s, 0) + 1
            return {
                "job": dataclasses.asdict(self.job),
                "participants": counts,
                "clients_registered": len(self._last_seen),
                "clients_live": len(self._live_clients(time.time())),
                "aggregating": self._aggregating,
                "secure_stage": self._secure.stage.value if self._secure is not None else None,
                "rounds": self.store.rounds(),
                "privacy": self.store.get_meta("privacy"),
            }


def _config_summary(config: ServerConfig) -> dict[str, Any]:
    """The configuration as JSON, without secrets (auth tokens)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "auth_tokens":
            value = sorted(value)
        elif f.name in ("secure_aggregation", "differential_privacy") and value is not None:
            value = dataclasses.asdict(value)
        elif isinstance(value, Path):
            value = str(value)
        out[f.name] = value
    return out


def _secure_stage(store: Store, job: JobState | None) -> str | None:
    """The stage of the job's open secure round, if any (from its saved state)."""
    data = store.secure_state(job.round) if job is not None else None
    if data is None:
        return None
    try:
        return SecureRound.from_bytes(data).stage.value
    except SecAggError as e:
        return f"unreadable: {e}"


def read_status(state_dir: Path) -> dict[str, Any]:
    """The job's status straight from a state dir (works whether or not the daemon runs)."""
    db = Path(state_dir) / "state.db"
    if not db.exists():
        raise ConfigError(f"{str(state_dir)!r} holds no sporenet-server state (no state.db)")
    store = Store(db)
    try:
        job = store.job()
        latest = store.model(job.model_version) if job else None
        return {
            "job": dataclasses.asdict(job) if job else None,
            "model": dataclasses.asdict(latest) if latest else None,
            "clients_registered": len(store.clients()),
            "rounds": store.rounds(),
            "participants": (
                {
                    cid: status
                    for cid, (status, _, _) in store.participants(job.round, job.phase).items()
                }
                if job
                else {}
            ),
            "config": store.get_meta("config"),
            "secure_stage": _secure_stage(store, job),
            "privacy": store.get_meta("privacy"),
        }
    finally:
        store.close()


__all__ = [
    "RoundManager",
    "TaskInfo",
    "TransferError",
    "Weights",
    "read_status",
    "weighted_metrics",
]
