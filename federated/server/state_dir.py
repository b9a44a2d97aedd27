"""Opening a state dir: refuse one that is unusable or damaged instead of starting over.

A job's progress lives in `state.db` (with its WAL) and the files beside it. If the
database is missing, unreadable or holds no job while model versions are on disk, a fresh
start would overwrite `models/v00001.spore` and lose the job, so the daemon refuses with a
message that says what is wrong and what the operator can do (federated/README.md,
"When the state dir is damaged").
"""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import threading
from pathlib import Path
from typing import ClassVar

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.state import Store

RECOVER = (
    "restore the state dir from a backup, or start the job again in an empty --state-dir "
    "(keep this one to inspect it)"
)
_VERSION = re.compile(r"v(\d{5})\.spore")


LOCK_FILE = "daemon.lock"


class StateDirLock:
    """One daemon per state dir: an exclusive `flock` on `daemon.lock` inside it.

    The kernel releases the lock when the process ends, however it ends (`kill -9`
    included), so a crash never leaves it stale. Within one process the lock is shared
    (an edge takes it at start and again when it builds its round manager): it is
    released when the last holder closes it.
    """

    _held: ClassVar[dict[Path, tuple[int, int]]] = {}  # resolved dir -> (fd, holders)
    _guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self._open = False
        with self._guard:
            held = self._held.get(self.root)
            if held is None:
                self._held[self.root] = (self._acquire(), 1)
            else:
                self._held[self.root] = (held[0], held[1] + 1)
        self._open = True

    def _acquire(self) -> int:
        path = self.root / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"--state-dir {str(self.root)!r} is in use by another daemon (pid {holder}):"
                " stop it first, or give this one another --state-dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def close(self) -> None:
        """Give the lock back (the last holder in this process releases it)."""
        if not self._open:
            return
        self._open = False
        with self._guard:
            fd, holders = self._held[self.root]
            if holders > 1:
                self._held[self.root] = (fd, holders - 1)
                return
            del self._held[self.root]
        os.close(fd)  # closing the descriptor releases the flock


def _versions_on_disk(root: Path) -> list[int]:
    models = root / "models"
    if not models.is_dir():
        return []
    return sorted(int(m.group(1)) for p in models.iterdir() if (m := _VERSION.fullmatch(p.name)))


def prepare(root: Path) -> None:
    """Create the state dir and its subdirectories, and check it can be written."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--state-dir {str(root)!r} is not a directory")
    try:
        for sub in ("rounds", "uploads", "models"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        probe = root / ".write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"--state-dir {str(root)!r} is not writable ({e.strerror or e}): the daemon "
            "must be able to create files there"
        ) from None


def open_store(root: Path) -> Store:
    """The state database of `root`, checked against the files beside it.

    Raises:
        ConfigError: the database is unreadable, or lost the job that the model
            versions on disk show was running.
    """
    db = root / "state.db"
    versions = _versions_on_disk(root)
    if versions and not db.exists():
        raise ConfigError(
            f"state dir {str(root)!r} is damaged: state.db is missing but models/ holds "
            f"{len(versions)} model version(s); {RECOVER}"
        )
    try:
        store = Store(db)
        job = store.job()
    except (sqlite3.DatabaseError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(
            f"state dir {str(root)!r} is damaged: {str(db)!r} is unreadable ({e}); {RECOVER}"
        ) from None
    problem = ""
    if job is None and versions:
        problem = (
            f"the database holds no job but models/ holds {len(versions)} model version(s) "
            "(state.db or its write-ahead log state.db-wal was lost or damaged)"
        )
    elif job is not None and versions and versions[-1] > job.model_version + 1:
        # One version past the job's may be a kill -9 between writing it and recording it.
        problem = (
            f"the database is at model version {job.model_version} but models/ holds "
            f"v{versions[-1]:05d} (state.db-wal was lost or damaged)"
        )
    if problem:
        store.close()
        raise ConfigError(f"state dir {str(root)!r} is damaged: {problem}; {RECOVER}")
    return store
