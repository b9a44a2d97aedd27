"""Receiving one update upload into memory: what UploadUpdate calls and Session streams share.

The bytes go straight into one buffer of the declared size (bounded by `max_update_bytes`,
and each receiving slot holds one), so a complete update is checked, validated and folded
without a trip through the file system. An upload that stops early keeps what arrived in
its `.part` file, from which a later call or session resumes.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from sporenet.federated.common.buffers import BufferPool
from sporenet.federated.common.checksum import update_mismatch
from sporenet.federated.errors import TransferError, UpdateRejectedError
from sporenet.federated.server.models import write_atomic
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.rounds import RoundManager
from sporenet.proto import federated_pb2 as pb

UPLOAD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOUCH_EVERY_CHUNKS = 16  # a long upload marks its client alive this often


def check_upload_id(upload_id: str) -> None:
    """Refuse an upload id that could not name a file safely."""
    if not UPLOAD_ID.match(upload_id):
        raise UpdateRejectedError(
            f"upload_id must be 1-64 characters of [A-Za-z0-9_-], got {upload_id!r}"
        )


class UploadReceiver:
    """One upload of `client_id` being received, resumed from its `.part` file if any.

    Feed it chunks with `add`, then always `close` it; a `complete` one is `submit`ted.
    """

    def __init__(
        self,
        manager: RoundManager,
        metrics: Metrics,
        client_id: str,
        header: pb.UploadHeader,
        pool: BufferPool,
    ) -> None:
        self.m, self.metrics, self.cid, self.h = manager, metrics, client_id, header
        self._path: Path | None = None
        self.kept = 0
        if manager.has_part(client_id) and self.path.exists():
            self.kept = self.path.stat().st_size
        self.pool = pool
        self.view = pool.take(header.total_size)
        self.size = 0  # bytes of `view` received so far
        if self.kept:
            with open(self.path, "rb") as f:
                self.size = f.readinto(self.view[: self.kept]) or 0
        self._chunks = 0

    @property
    def path(self) -> Path:
        """The `.part` file of this upload (named only when needed: most uploads arrive
        whole and never touch it)."""
        if self._path is None:
            self._path = self.m.upload_path(self.cid, self.h.upload_id)
        return self._path

    @property
    def complete(self) -> bool:
        return self.size == self.h.total_size

    def add(self, at: int, data: bytes | memoryview) -> None:
        """Take the chunk that starts at byte `at`: TransferError when it does not follow
        the bytes received, a refusal (counted against the client) when it runs past the
        declared size."""
        if at != self.size:
            raise TransferError(f"chunk at offset {at} does not follow byte {self.size}")
        if self.size + len(data) > self.h.total_size:
            self.path.unlink(missing_ok=True)
            self.kept = self.size  # nothing is kept: the upload is refused
            self.m.refuse(
                self.cid,
                UpdateRejectedError(
                    f"upload sends more than the {self.h.total_size} bytes its header declared"
                ),
            )
        self.view[self.size : self.size + len(data)] = data
        self.size += len(data)
        self._chunks += 1
        if self._chunks % TOUCH_EVERY_CHUNKS == 0:
            self.m.touch(self.cid)  # a long upload is a sign of life

    def close(self) -> None:
        """Count what arrived; if the upload stopped early, keep it for a resumption."""
        self.metrics.inc("sporenet_bytes_received_total", self.size - self.kept)
        if not self.complete:
            if self.size > self.kept:
                self.m.note_part(self.cid)
                write_atomic(self.path, self.view[: self.size])
            self.pool.give(self.view)

    def incomplete_reply(self) -> pb.UploadReply:
        return pb.UploadReply(
            accepted=False, received=self.size, message="incomplete: resume from `received`"
        )

    def submit(self) -> pb.UploadReply:
        """Check, validate, keep and fold the complete update (blocking: on a worker thread,
        unless the update is small, see session.INLINE_SUBMIT_BYTES). Its CPU time is
        counted apart, so the server's cost per update splits into this and transport."""
        start = time.thread_time()
        try:
            mismatch = update_mismatch(self.h, self.view)
            self.m.submit_update(
                self.cid,
                self.h.task_id,
                self.view,
                upload=self.path if self.kept else None,
                mismatch=mismatch,
                num_samples=self.h.num_samples,
                metrics_json=self.h.metrics_json,
                # A header CRC-32 the bytes matched is theirs: the kept copy reuses it.
                crc=self.h.crc32 if self.h.HasField("crc32") and not mismatch else None,
            )
        finally:
            self.metrics.inc("sporenet_update_cpu_seconds_total", time.thread_time() - start)
        # Folded: the buffer is free. (A refused update's buffer is simply dropped: its
        # exception's frames may still hold views of it.)
        self.pool.give(self.view)
        return pb.UploadReply(accepted=True, received=self.size)
