"""The server's durable state: one SQLite database (WAL mode) under --state-dir.

Tables: `meta` (the job record and its configuration as JSON), `clients` (registrations),
`participants` (who was asked to do what in each round and how it ended), `models` (one row
per published model version; the bytes live in files next to the database) and `rounds`
(per-round summaries). Every state transition is one transaction, so a `kill -9` leaves the
database at the last completed transition.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sporenet.federated.server.phases import JobStatus, Phase

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
  client_id TEXT PRIMARY KEY, name TEXT NOT NULL, registered_at REAL NOT NULL, info TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS participants (
  round INTEGER NOT NULL, phase TEXT NOT NULL, client_id TEXT NOT NULL, status TEXT NOT NULL,
  num_samples INTEGER NOT NULL DEFAULT 0, metrics TEXT NOT NULL DEFAULT '{}',
  updated_at REAL NOT NULL, PRIMARY KEY (round, phase, client_id)
);
CREATE TABLE IF NOT EXISTS models (
  version INTEGER PRIMARY KEY, round INTEGER NOT NULL, file TEXT NOT NULL, sha256 TEXT NOT NULL,
  size INTEGER NOT NULL, created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rounds (
  round INTEGER NOT NULL, phase TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL,
  num_results INTEGER NOT NULL DEFAULT 0, metrics TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (round, phase)
);
CREATE TABLE IF NOT EXISTS secure_rounds (round INTEGER PRIMARY KEY, state BLOB NOT NULL);
"""


@dataclass
class JobState:
    """Where the job is: what survives a restart of the round loop."""

    status: JobStatus = JobStatus.RUNNING
    round: int = 1  # the round in progress (1-based); once finished, the last round
    phase: Phase = Phase.FIT
    active: bool = False  # False: waiting for enough live clients to start the phase
    attempt: int = 0  # how often the current phase re-sampled clients after a shortfall
    # Reselections in a row (deadlines passed short of min_clients) that brought no new
    # update, and the accepted count at the last deadline they are measured against.
    fruitless: int = 0
    accepted_at_deadline: int = 0
    secure_attempt: int = 0  # failed secure runs of the current fit round (each resampled)
    phase_started: float = 0.0
    deadline: float = 0.0
    waiting_since: float = 0.0
    model_version: int = 0
    reason: str = ""
    # Differential privacy of the open fit phase: the cohort size (the noised mean's
    # denominator) and the sampling rate cohort/live the accountant charges.
    dp_cohort: int = 0
    dp_sample_rate: float = 0.0


@dataclass
class ModelRecord:
    """One published model version."""

    version: int
    round: int
    file: str
    sha256: str
    size: int
    crc32: int | None = None  # what clients check a download against (checksum.py)


class Store:
    """Thread-safe access to the state database (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable across process crashes (kill -9) in WAL mode; only a power
            # loss may drop the last transactions.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def transaction(self) -> _Transaction:
        """`with store.transaction() as db:` runs its statements atomically."""
        return _Transaction(self)

    # -- reads ----------------------------------------------------------------------------

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def get_meta(self, key: str) -> Any:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def job(self) -> JobState | None:
        raw = self.get_meta("job")
        if not raw:
            return None
        return JobState(**{**raw, "status": JobStatus(raw["status"]), "phase": Phase(raw["phase"])})

    def clients(self) -> dict[str, str]:
        return {cid: name for cid, name in self._query("SELECT client_id, name FROM clients")}

    def participants(
        self, round_: int, phase: str, status: str | None = None
    ) -> dict[str, tuple[str, int, dict[str, Any]]]:
        """The round's participant rows of `phase` (only those of `status`, if given)."""
        where, args = "round = ? AND phase = ?", [round_, phase]
        if status is not None:
            where, args = where + " AND status = ?", [*args, status]
        rows = self._query(
            "SELECT client_id, status, num_samples, metrics FROM participants "
            f"WHERE {where} ORDER BY updated_at, client_id",
            tuple(args),
        )
        return {cid: (s, n, json.loads(m)) for cid, s, n, m in rows}

    def model(self, version: int) -> ModelRecord | None:
        rows = self._query(
            "SELECT version, round, file, sha256, size FROM models WHERE version = ?", (version,)
        )
        return ModelRecord(*rows[0]) if rows else None

    def models(self) -> list[ModelRecord]:
        """Every published version's record, oldest first."""
        rows = self._query("SELECT version, round, file, sha256, size FROM models ORDER BY version")
        return [ModelRecord(*row) for row in rows]

    def has_secure_state(self) -> bool:
        """Whether any secure round's state is kept (the job runs secure aggregation)."""
        return bool(self._query("SELECT 1 FROM secure_rounds LIMIT 1"))

    def secure_state(self, round_: int) -> bytes | None:
        """The persisted SecureRound of a secure fit round (None when there is none)."""
        rows = self._query("SELECT state FROM secure_rounds WHERE round = ?", (round_,))
        return bytes(rows[0][0]) if rows else None

    def rounds(self) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT round, phase, started_at, finished_at, num_results, metrics FROM rounds "
            "ORDER BY round, phase"
        )
        return [
            {
                "round": r,
                "phase": p,
                "started_at": s,
                "finished_at": f,
                "num_results": n,
                "metrics": json.loads(m),
            }
            for r, p, s, f, n, m in rows
        ]


_SET_PARTICIPANT = (
    "INSERT INTO participants (round, phase, client_id, status, num_samples, metrics, "
    "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(round, phase, client_id) DO "
    "UPDATE SET status = excluded.status, num_samples = excluded.num_samples, "
    "metrics = excluded.metrics, updated_at = excluded.updated_at"
)


class _Transaction:
    """The write side: statements between BEGIN IMMEDIATE and COMMIT."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __enter__(self) -> _Transaction:
        self._store._lock.acquire()
        self._store._db.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self._store._db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self._store._lock.release()

    def set_meta(self, key: str, value: Any) -> None:
        self._store._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )

    def set_job(self, job: JobState) -> None:
        self.set_meta("job", dataclasses.asdict(job))

    def add_client(self, client_id: str, name: str, info: dict[str, str]) -> None:
        self._store._db.execute(
            "INSERT OR IGNORE INTO clients (client_id, name, registered_at, info) "
            "VALUES (?, ?, ?, ?)",
            (client_id, name, time.time(), json.dumps(info)),
        )

    def set_participant(
        self,
        round_: int,
        phase: str,
        client_id: str,
        status: str,
        num_samples: int = 0,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        self._store._db.execute(
            _SET_PARTICIPANT,
            (round_, phase, client_id, status, num_samples, json.dumps(metrics or {}), time.time()),
        )

    def set_participants(
        self,
        round_: int,
        phase: str,
        rows: Iterable[tuple[str, str, int, dict[str, Any] | None]],
    ) -> None:
        """Write many participant rows of one phase, (client id, status, samples, metrics)
        each, in one statement: a buffer carries hundreds of devices over at once."""
        now = time.time()
        self._store._db.executemany(
            _SET_PARTICIPANT,
            (
                (round_, phase, cid, status, n, json.dumps(metrics or {}), now)
                for cid, status, n, metrics in rows
            ),
        )

    def set_secure_state(self, round_: int, state: bytes) -> None:
        self._store._db.execute(
            "INSERT OR REPLACE INTO secure_rounds (round, state) VALUES (?, ?)", (round_, state)
        )

    def delete_secure_state(self, round_: int) -> None:
        self._store._db.execute("DELETE FROM secure_rounds WHERE round = ?", (round_,))

    def add_model(self, record: ModelRecord) -> None:
        self._store._db.execute(
            "INSERT OR REPLACE INTO models (version, round, file, sha256, size, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (record.version, record.round, record.file, record.sha256, record.size, time.time()),
        )

    def start_round(self, round_: int, phase: str) -> None:
        self._store._db.execute(
            "INSERT OR IGNORE INTO rounds (round, phase, started_at) VALUES (?, ?, ?)",
            (round_, phase, time.time()),
        )

    def finish_round(
        self, round_: int, phase: str, num_results: int, metrics: dict[str, Any]
    ) -> None:
        self._store._db.execute(
            "UPDATE rounds SET finished_at = ?, num_results = ?, metrics = ? "
            "WHERE round = ? AND phase = ?",
            (time.time(), num_results, json.dumps(metrics), round_, phase),
        )
