"""The published model versions on disk: `.spore` files and the optimizer's moments.

Every file is written to a temporary name and renamed into place, so a `kill -9` leaves
either the old or the new version, never half of one. The store (SQLite) records each
version's digest; this module only reads and writes the files.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np

from sporenet.federated.common.checksum import crc32
from sporenet.federated.errors import ConfigError
from sporenet.federated.server.state import ModelRecord

_FILE = re.compile(r"v(\d{5})(\.spore|\.opt\.npz)")


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

    def path(self, record: ModelRecord) -> Path:
        """The file of a published version."""
        return self.root / record.file

    def write(self, version: int, round_: int, data: bytes | memoryview) -> ModelRecord:
        """Write model `version` (published after `round_`); its record for the store."""
        name = f"models/v{version:05d}.spore"
        write_atomic(self.root / name, data)
        digest = hashlib.sha256(data).hexdigest()
        return ModelRecord(version, round_, name, digest, len(data), crc32(data))

    def read(self, record: ModelRecord) -> bytes:
        """The bytes of a published version (its record gains the CRC-32 clients check).

        Raises:
            ConfigError: the file is missing, unreadable, or not the bytes its record's
                sha256 names (damaged bytes are never served).
        """
        path = self.path(record)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ConfigError(
                f"state dir {str(self.root)!r}: cannot read model version {record.version} "
                f"({str(path)!r}): {e.strerror or e}; restore the file from a backup"
            ) from None
        if len(data) != record.size or hashlib.sha256(data).hexdigest() != record.sha256:
            raise ConfigError(
                f"state dir {str(self.root)!r}: model version {record.version} "
                f"({str(path)!r}) is damaged: {len(data)} bytes with sha256 "
                f"{hashlib.sha256(data).hexdigest()[:16]}..., the state records {record.size} "
                f"bytes with sha256 {record.sha256[:16]}...; restore the file from a backup"
            )
        record.crc32 = crc32(data)  # not stored: computed again on every start
        return data

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
