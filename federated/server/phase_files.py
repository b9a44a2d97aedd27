"""One fit phase's files: the aggregate checkpoint, and the journal of accepted updates
that builds before group commit (group_commit.py) wrote.

This build acknowledges an update once a checkpoint holds it and writes no journal; a
state dir of the previous build may hold one, which a restart still reads: it restores
the last checkpoint of the aggregate and folds the journalled updates received after it
again (`append` writes that format, for its tests). Each update is one appended record (a
single write: no file created, renamed or deleted per update); a checkpoint holds every
update journalled before it, so it empties the journal. A record also carries the
client's participant row (its sample count and metrics), so the store writes the rows of
accepted updates once per checkpoint, not once per update (JobContext.set_status). Each
record ends with the CRC-32s of its row and of its update, so a damaged one is never
folded.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from sporenet.federated.aggregation import Aggregator
from sporenet.federated.common.checksum import crc32
from sporenet.federated.server.checkpoint import load_arrays, save_arrays

# A record: magic, the length of its row (JSON: client id, samples, metrics), the
# update's length; the row, the update; the row's CRC-32, the update's CRC-32.
MAGIC = b"SPJ2"
HEAD = struct.Struct("<4sIQ")
TAIL = struct.Struct("<II")

KEY_BYTES = 24  # hex digits of a client's file key
#: A journalled participant row: (samples, metrics).
Row = tuple[int, dict[str, Any]]


@functools.lru_cache(maxsize=4096)  # asked for every update: once per client is enough
def file_key(client_id: str) -> str:
    """A filesystem-safe name for a client id (ids may be arbitrary configured names)."""
    return hashlib.sha256(client_id.encode()).hexdigest()[:KEY_BYTES]


class PhaseFiles:
    """`rounds/rNNNNN-PHASE/journal` (accepted updates since the last checkpoint) and
    `rounds/rNNNNN-PHASE.ckpt` (the aggregate). Not thread-safe: the round manager calls
    it under its lock."""

    def __init__(self, state_dir: Path, round_: int, phase: str) -> None:
        self.dir = Path(state_dir) / "rounds" / f"r{round_:05d}-{phase}"
        self.journal_path = self.dir / "journal"
        self.checkpoint_path = self.dir.with_suffix(".ckpt")
        self._fd: int | None = None
        # Where each client's last record is (id -> (offset, size, row)), once read.
        self._index: dict[str, tuple[int, int, Row]] | None = None

    def append(
        self,
        client_id: str,
        payload: memoryview,
        crc: int | None = None,
        *,
        num_samples: int = 0,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Journal an update and its participant row with one write. `crc` is the
        payload's CRC-32 when the caller already has it (computed otherwise)."""
        if self._fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        row = json.dumps([client_id, num_samples, metrics or {}]).encode()
        head = HEAD.pack(MAGIC, len(row), len(payload))
        tail = TAIL.pack(crc32(row), crc32(payload) if crc is None else crc)
        parts = [head, row, payload, tail]
        total = len(head) + len(row) + len(payload) + len(tail)
        written = os.writev(self._fd, parts)
        while written < total:  # a short write (a signal, a full disk): finish it
            data = b"".join(bytes(p) for p in parts)[written:]
            written += os.write(self._fd, data)
        self._index = None

    def read_kept(self, client_id: str) -> bytes | None:
        """The client's last journalled update; None when it is missing or fails its CRC-32."""
        if self._index is None:
            self._index = self._scan()
        where = self._index.get(client_id)
        if where is None:
            return None
        offset, size, _ = where
        with open(self.journal_path, "rb") as f:
            f.seek(offset)
            data = f.read(size + TAIL.size)
        if len(data) != size + TAIL.size:
            return None
        payload = memoryview(data)[:size]
        if TAIL.unpack_from(data, size)[1] != crc32(payload):
            return None
        return bytes(payload)

    def rows(self) -> dict[str, Row]:
        """The participant row of each client with a journalled update (its last one):
        the accepted updates whose rows the store may not have yet."""
        if self._index is None:
            self._index = self._scan()
        return {cid: row for cid, (_, _, row) in self._index.items()}

    def _scan(self) -> dict[str, tuple[int, int, Row]]:
        """Where each client's last update starts, and its row, read up to the first torn
        or damaged record head or row (a crash in the middle of an append)."""
        index: dict[str, tuple[int, int, Row]] = {}
        try:
            f = open(self.journal_path, "rb")  # noqa: SIM115 (closed below)
        except OSError:
            return index
        with f:
            end = os.fstat(f.fileno()).st_size
            at = 0
            while at + HEAD.size <= end:
                f.seek(at)
                magic, row_size, size = HEAD.unpack(f.read(HEAD.size))
                record = HEAD.size + row_size + size + TAIL.size
                if magic != MAGIC or at + record > end:
                    break
                raw = f.read(row_size)
                f.seek(at + record - TAIL.size)
                if TAIL.unpack(f.read(TAIL.size))[0] != crc32(raw):
                    break
                cid, n, metrics = json.loads(raw)  # its CRC-32 matched: as written
                index[cid] = (at + HEAD.size + row_size, size, (n, metrics))
                at += record
        return index

    def checkpoint(self, aggregator: Aggregator) -> None:
        """Save the aggregate, then empty the journal: the checkpoint holds its updates
        (a crash in between leaves records of clients the checkpoint names: skipped)."""
        save_arrays(self.checkpoint_path, aggregator.snapshot())
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
        elif self.journal_path.exists():
            os.truncate(self.journal_path, 0)
        self._index = None

    def restore(self, aggregator: Aggregator) -> None:
        """Load the last checkpoint, if any, into a fresh aggregator."""
        if self.checkpoint_path.exists():
            aggregator.restore(load_arrays(self.checkpoint_path))

    def close(self) -> None:
        """Close the journal (it stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """Delete the phase's files once its model is published."""
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.checkpoint_path.unlink(missing_ok=True)
        self._index = None
