"""One fit phase's files: accepted updates kept on disk until a checkpoint holds them.

An update counts only once its bytes are in the phase directory, so a `kill -9` loses no
accepted update: a restart restores the last checkpoint of the aggregate and folds the
kept updates received after it again. A checkpoint then makes those files redundant.
Each kept update ends with the CRC-32 of its bytes, so a damaged one is never folded.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import struct
import threading
from pathlib import Path

from sporenet.federated.aggregation import Aggregator
from sporenet.federated.common.checksum import crc32
from sporenet.federated.server.checkpoint import load_arrays, save_arrays


@functools.lru_cache(maxsize=4096)  # asked for every update: once per client is enough
def file_key(client_id: str) -> str:
    """A filesystem-safe name for a client id (ids may be arbitrary configured names)."""
    return hashlib.sha256(client_id.encode()).hexdigest()[:24]


class PhaseFiles:
    """`rounds/rNNNNN-PHASE/` (kept updates) and `rounds/rNNNNN-PHASE.ckpt` (aggregate)."""

    def __init__(self, state_dir: Path, round_: int, phase: str) -> None:
        self.dir = Path(state_dir) / "rounds" / f"r{round_:05d}-{phase}"
        self.checkpoint_path = self.dir.with_suffix(".ckpt")
        self._made = False

    def kept(self, client_id: str) -> Path:
        """Where the client's accepted update is kept."""
        return self.dir / f"{file_key(client_id)}.upd"

    def write_pending(self, client_id: str, payload: memoryview, crc: int | None = None) -> Path:
        """Write an update to a temporary file beside its kept place; `keep` commits it.
        `crc` is the payload's CRC-32 when the caller already has it (computed otherwise)."""
        if not self._made:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._made = True
        tmp = self.kept(client_id).with_name(f"{file_key(client_id)}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(payload)
            f.write(struct.pack("<I", crc32(payload) if crc is None else crc))
        return tmp

    def read_kept(self, client_id: str) -> bytes | None:
        """The client's kept update; None when it is missing or fails its CRC-32."""
        try:
            data = self.kept(client_id).read_bytes()
        except OSError:
            return None
        if len(data) < 4 or struct.unpack_from("<I", data, len(data) - 4)[0] != crc32(
            memoryview(data)[:-4]
        ):
            return None
        return data[:-4]

    def keep(self, pending: Path, client_id: str) -> None:
        """Make a written update the client's kept one (an atomic rename)."""
        os.replace(pending, self.kept(client_id))

    def checkpoint(self, aggregator: Aggregator, dropped: int = 0) -> int:
        """Save the aggregate, then drop the kept updates it now contains.

        `dropped`: how many of `aggregator.clients` (in fold order) had their kept updates
        dropped by an earlier checkpoint of the same aggregator; only the rest are
        unlinked (otherwise every checkpoint would try every client folded so far: a round
        of N updates would cost N^2 / checkpoint_every unlinks). Returns the new count.
        """
        save_arrays(self.checkpoint_path, aggregator.snapshot())
        clients = aggregator.clients
        for cid in clients[dropped:]:
            self.kept(cid).unlink(missing_ok=True)
        return len(clients)

    def restore(self, aggregator: Aggregator) -> None:
        """Load the last checkpoint, if any, into a fresh aggregator."""
        if self.checkpoint_path.exists():
            aggregator.restore(load_arrays(self.checkpoint_path))

    def remove(self) -> None:
        """Delete the phase's files once its model is published."""
        shutil.rmtree(self.dir, ignore_errors=True)
        self.checkpoint_path.unlink(missing_ok=True)
