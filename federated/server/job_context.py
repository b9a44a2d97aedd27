"""What the round manager's collaborators share: the job's stores, machine and open phase.

One `JobContext` per job, built by the round manager and handed to the open phase and
the publisher, so each reads the same collaborators through public attributes instead
of reaching into another object. Its `lock` guards everything here; `changed` is the
condition held polls wait on, `wake` the event that makes the round loop tick early.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sporenet.federated.aggregation import Aggregator
from sporenet.federated.server.config import ServerConfig
from sporenet.federated.server.current_model import CurrentModel
from sporenet.federated.server.group_commit import GroupCommit
from sporenet.federated.server.ledger import PrivacyLedger
from sporenet.federated.server.machine import RoundMachine
from sporenet.federated.server.models import ModelStore
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phase_files import PhaseFiles, file_key
from sporenet.federated.server.phases import Participant
from sporenet.federated.server.state import JobState, Store
from sporenet.federated.strategies.base import Strategy

if TYPE_CHECKING:
    from sporenet.federated.server.open_phase import OpenPhase

Clock = Callable[[], float]


class PartialUploads:
    """The `.part` files interrupted uploads keep under `state_dir/uploads`."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "uploads"
        self._with_parts: set[str] = set()  # clients whose uploads may have kept a .part

    def path(self, client_id: str, upload_id: str) -> Path:
        return self.dir / f"{file_key(client_id)}-{upload_id}.part"

    def note(self, client_id: str) -> None:
        self._with_parts.add(client_id)

    def has(self, client_id: str) -> bool:
        return client_id in self._with_parts

    def clear(self, client_id: str | None = None) -> None:
        """Delete partial uploads: a client's once its update is in, everyone's when the
        phase closes (they belong to its task) and at start. Only a client noted by
        `note` has any to look for: most updates arrive in one go."""
        if client_id is not None:
            if client_id not in self._with_parts:
                return
            self._with_parts.discard(client_id)
            pattern = f"{file_key(client_id)}-*.part"
        else:
            self._with_parts.clear()
            pattern = "*.part"
        for part in self.dir.glob(pattern):
            part.unlink(missing_ok=True)


@dataclass
class JobContext:
    """The job's shared collaborators (every field public; guarded by `lock`)."""

    config: ServerConfig
    metrics: Metrics
    log: logging.Logger
    clock: Clock
    dir: Path
    store: Store
    models: ModelStore
    model: CurrentModel
    clients: Participants
    privacy: PrivacyLedger
    strategy: Strategy
    machine: RoundMachine
    uploads: PartialUploads
    lock: threading.RLock = field(default_factory=threading.RLock)
    changed: threading.Condition = field(init=False)
    # Set when an arrival may let the round loop act (start or close a phase) before its
    # next periodic tick. Polls are woken only by phase changes: waking every poller on
    # every update costs O(clients²) per round.
    wake: threading.Event = field(default_factory=threading.Event)
    # Told of every `notify`: with the clients whose tasks changed, or None for anyone's.
    listeners: list[Callable[[Collection[str] | None], None]] = field(default_factory=list)
    phase: OpenPhase | None = None  # the open phase (None while waiting or ended)
    # Folded updates and which of them are durable: uploads are answered once they are.
    commits: GroupCommit = field(default_factory=GroupCommit)
    _files: tuple[tuple[int, str], PhaseFiles] | None = None
    # Rows of accepted updates not written to the store yet (the next checkpoint writes
    # them): client -> (round, phase, status, samples, metrics). See `save_rows`.
    _unsaved: dict[str, tuple[int, str, Participant, int, dict[str, Any] | None]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    @property
    def job(self) -> JobState:
        return self.machine.job

    def notify(self, clients: Collection[str] | None = None) -> None:
        """Tell held polls and the sessions that tasks may have changed (under the lock):
        anyone's, or only those of `clients` (say, the devices just assigned work)."""
        self.changed.notify_all()
        for listener in self.listeners:
            listener(clients)

    def wake_if_settled(self) -> None:
        """Wake the round loop once no selected client is left to report (call it under
        the lock): only then can an arrival close the phase early; deadlines and dropouts
        it checks on its own ticks."""
        if not self.clients.waiting():
            self.wake.set()

    def files(self) -> PhaseFiles:
        """The open phase's files (made once per phase: every update asks)."""
        files = self._files
        key = (self.job.round, self.job.phase.value)
        if files is None or files[0] != key:
            files = self._files = (key, PhaseFiles(self.dir, *key))
        return files[1]

    def close_files(self) -> None:
        if self._files is not None:
            self._files[1].close()

    def save_job(self) -> None:
        with self.store.transaction() as tx:
            tx.set_job(self.job)

    def set_status(
        self,
        client_id: str,
        status: Participant,
        num_samples: int = 0,
        metrics: dict[str, Any] | None = None,
        *,
        tx: Any = None,
        journalled: bool = False,
    ) -> None:
        """Change a participant's status in memory and in the store (in `tx`, if given).

        `journalled`: the row of an accepted update, which counts only once its batch is
        checkpointed (group_commit.py): the store gets it with the phase's next
        `save_rows`, one transaction for many updates.
        """
        self.clients.set(client_id, status)
        job = self.job
        if journalled:
            self._unsaved[client_id] = (job.round, job.phase, status, num_samples, metrics)
            return
        self._unsaved.pop(client_id, None)  # this row supersedes a journalled one
        if tx is not None:
            tx.set_participant(job.round, job.phase, client_id, status, num_samples, metrics)
            return
        with self.store.transaction() as own:
            own.set_participant(job.round, job.phase, client_id, status, num_samples, metrics)

    def save_rows(self) -> None:
        """Write the accepted updates' rows to the store: before each checkpoint of the
        aggregate that holds them, and before the phase's rows are read back from the
        store."""
        with self.lock:
            if not self._unsaved:
                return
            phases: dict[tuple[int, str], list[tuple[str, str, int, Any]]] = {}
            for cid, (round_, phase, status, n, metrics) in self._unsaved.items():
                phases.setdefault((round_, phase), []).append((cid, status, n, metrics))
            with self.store.transaction() as tx:
                for (round_, phase), rows in phases.items():
                    tx.set_participants(round_, phase, rows)
            self._unsaved.clear()

    def checkpoint(self, aggregator: Aggregator) -> None:
        """Save the accepted updates' rows, then the aggregate that holds them, then
        acknowledge them (group_commit.py); a failed write is told to their waiters."""
        try:
            self.save_rows()
            self.files().checkpoint(aggregator)
        except Exception as e:
            self.commits.failed(e)
            raise
        self.commits.made_durable()

    def end_phase(self) -> None:
        """After the transaction that moved the job on: the phase's statuses, its object
        and partial uploads go (call it under the lock)."""
        self.clients.end_phase()
        self._unsaved.clear()  # saved (read back to publish) or moot (the phase failed)
        self.uploads.clear()
        self.phase = None
