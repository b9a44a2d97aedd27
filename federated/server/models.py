"""The published model versions on disk: `.spore` files and the optimizer's moments.

Every file is written to a temporary name and renamed into place, so a `kill -9` leaves
either the old or the new version, never half of one. The store (SQLite) records each
version's digest; this module only reads and writes the files.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

import numpy as np

from sporenet.federated.common.checksum import crc32
from sporenet.federated.errors import ModelDamagedError
from sporenet.federated.server.state import ModelRecord

_FILE = re.compile(r"v(\d{5})(\.spore|\.opt\.npz)")
_HASH_BLOCK = 1 << 20


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Replace `path` with `data` (a temporary file, then a rename: never half written)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class ModelStore:
    """Model versions under `state_dir/models`: v00000.spore is the initial model."""

    def __init__(self, state_dir: Path) -> None:
        self.root = Path(state_dir)
        (self.root / "models").mkdir(parents=True, exist_ok=True)
        # version -> (sha256, the file's identity when its bytes were last found to match):
        # a file is hashed again whenever anything wrote to it since (ctime, size, inode).
        self._verified: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._lock = threading.Lock()

    def path(self, record: ModelRecord) -> Path:
        """The file of a published version."""
        return self.root / record.file

    def write(self, version: int, round_: int, data: bytes | memoryview) -> ModelRecord:
        """Write model `version` (published after `round_`); its record for the store."""
        name = f"models/v{version:05d}.spore"
        write_atomic(self.root / name, data)
        digest = hashlib.sha256(data).hexdigest()
        self._remember(version, digest, self.root / name)
        return ModelRecord(version, round_, name, digest, len(data), crc32(data))

    def verify(self, record: ModelRecord) -> None:
        """Check the version's file against its record before it is served: hashed in
        full unless it is unchanged since its bytes last matched.

        Raises:
            ModelDamagedError: the file is missing, unreadable or not those bytes.
        """
        path = self.path(record)
        try:
            identity = _identity(path)
        except OSError as e:
            raise self._damaged(record, f"cannot be read: {e.strerror or e}") from None
        with self._lock:
            if self._verified.get(record.version) == (record.sha256, identity):
                return
        digest, size = hashlib.sha256(), 0
        try:
            with open(path, "rb") as f:
                while block := f.read(_HASH_BLOCK):
                    digest.update(block)
                    size += len(block)
        except OSError as e:
            raise self._damaged(record, f"cannot be read: {e.strerror or e}") from None
        self._check(record, size, digest.hexdigest())
        with self._lock:
            self._verified[record.version] = (record.sha256, identity)

    def read(self, record: ModelRecord) -> bytes:
        """The bytes of a published version (its record gains the CRC-32 clients check).

        Raises:
            ModelDamagedError: the file is missing, unreadable, or not the bytes its
                record's sha256 names (damaged bytes are never served).
        """
        path = self.path(record)
        try:
            identity = _identity(path)
            data = path.read_bytes()
        except OSError as e:
            raise self._damaged(record, f"cannot be read: {e.strerror or e}") from None
        self._check(record, len(data), hashlib.sha256(data).hexdigest())
        with self._lock:
            self._verified[record.version] = (record.sha256, identity)
        record.crc32 = crc32(data)  # not stored: computed again on every start
        return data

    def _check(self, record: ModelRecord, size: int, sha256: str) -> None:
        if size != record.size or sha256 != record.sha256:
            raise self._damaged(
                record,
                f"is damaged: {size} bytes with sha256 {sha256[:16]}..., the state records "
                f"{record.size} bytes with sha256 {record.sha256[:16]}...",
            )

    def _damaged(self, record: ModelRecord, what: str) -> ModelDamagedError:
        return ModelDamagedError(
            f"state dir {str(self.root)!r}: model version {record.version} "
            f"({str(self.path(record))!r}) {what}; restore the file from a backup"
        )

    def _remember(self, version: int, sha256: str, path: Path) -> None:
        with self._lock:
            self._verified[version] = (sha256, _identity(path))

    def write_moments(self, version: int, moments: dict[str, np.ndarray]) -> None:
        """Save the server optimizer's state (FedAdam's moments...) beside `version`."""
        if not moments:
            return
        tmp = self.root / f"models/v{version:05d}.opt.tmp.npz"
        np.savez(tmp, **moments)  # type: ignore[arg-type]  # numpy types **kwds as bool
        os.replace(tmp, self._moments_path(version))

    def read_moments(self, version: int) -> dict[str, np.ndarray]:
        """The optimizer state saved with `version` ({} for strategies without one)."""
        path = self._moments_path(version)
        if not path.exists():
            return {}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    def prune(self, latest: int, keep: int) -> list[int]:
        """Delete what no restart or download needs once `latest` is recorded as the job's
        model: every optimizer state but `latest`'s, and (with `keep` > 0) the versions
        older than the newest `keep`, except v00000, the job's initial model. The versions
        deleted, oldest first. Call it only after the store commits `latest`: until then a
        restart resumes from the version before."""
        removed = []
        for path in (self.root / "models").iterdir():
            match = _FILE.fullmatch(path.name)
            if match is None:
                continue
            version = int(match.group(1))
            if match.group(2) == ".opt.npz" and version < latest:
                path.unlink(missing_ok=True)
            elif match.group(2) == ".spore" and keep and 0 < version <= latest - keep:
                path.unlink(missing_ok=True)
                removed.append(version)
        return sorted(removed)

    def _moments_path(self, version: int) -> Path:
        return self.root / f"models/v{version:05d}.opt.npz"


def _identity(path: Path) -> tuple[int, ...]:
    """What changes whenever a file is written: any write moves ctime, which user space
    cannot set back (unlike mtime)."""
    st = path.stat()
    return (st.st_ino, st.st_size, st.st_ctime_ns, st.st_mtime_ns)
