"""The user's labelled samples, kept in a local SQLite file.

Each sample is 64 pixel values (0-16, row-major 8x8) and a label. A fixed share of the
samples (every HOLDOUT_EVERY-th by id) is held out: personalization never trains on them,
so the before/after accuracy it reports is measured on samples the model has not seen.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import numpy as np

HOLDOUT_EVERY = 5
"""Sample ids divisible by this are held out for evaluation."""


class SampleStore:
    """A SQLite table of (pixels, label) rows; safe to use from several threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._lock = threading.Lock()
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS samples (id INTEGER PRIMARY KEY "
                "AUTOINCREMENT, pixels BLOB NOT NULL, label INTEGER NOT NULL)"
            )

    def add(self, pixels: np.ndarray, label: int) -> int:
        """Store one sample; returns the number of samples stored."""
        blob = np.asarray(pixels, np.float32).reshape(64).tobytes()
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO samples (pixels, label) VALUES (?, ?)", (blob, int(label))
            )
            return int(self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])

    def all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids (N,), pixels (N, 64) float32, labels (N,) int64), in insertion order."""
        with self._lock:
            rows = self._db.execute("SELECT id, pixels, label FROM samples ORDER BY id").fetchall()
        ids = np.array([r[0] for r in rows], np.int64)
        pixels = np.array([np.frombuffer(r[1], np.float32) for r in rows], np.float32).reshape(
            -1, 64
        )
        labels = np.array([r[2] for r in rows], np.int64)
        return ids, pixels, labels

    def split(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """((train pixels, labels), (held-out pixels, labels))."""
        ids, x, y = self.all()
        held = ids % HOLDOUT_EVERY == 0
        return (x[~held], y[~held]), (x[held], y[held])

    def close(self) -> None:
        with self._lock:
            self._db.close()
