"""What the server sends to many clients alike, encoded once: a phase's task, a model's chunks.

A fit or evaluate task is the same for every client its phase selected, and a model's
chunks the same for every download of that version, so each is serialized once and the
transport writes the same bytes to every client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from sporenet.federated.common.wire import (
    SECURE_STAGES,
    SessionReplyField,
    encode_model_chunks,
    frame_session,
)
from sporenet.federated.server.phases import TaskInfo, TaskType
from sporenet.federated.server.state import ModelRecord
from sporenet.proto import federated_pb2 as pb

CACHE_MODEL_BYTES = 64 << 20  # models up to this size are served from pre-encoded chunks

TASK_TYPES = {
    TaskType.WAIT: pb.TASK_WAIT,
    TaskType.FIT: pb.TASK_FIT,
    TaskType.EVALUATE: pb.TASK_EVALUATE,
    TaskType.DONE: pb.TASK_DONE,
    TaskType.SECURE_FIT: pb.TASK_SECURE_FIT,
}


def task_message(task: TaskInfo) -> pb.Task:
    """The wire `Task` of a TaskInfo."""
    msg = pb.Task(
        type=TASK_TYPES[task.type],
        round=task.round,
        task_id=task.task_id,
        config_json=json.dumps(task.config),
        retry_after_ms=int(task.retry_after * 1000),
        reason=task.reason,
    )
    if task.secure_stage:
        msg.secure_stage = SECURE_STAGES[task.secure_stage]
        msg.secure_setup, msg.secure_payload = task.secure_setup, task.secure_payload
    if task.model is not None:
        msg.model_version, msg.model_size, msg.model_sha256 = (
            task.model.version,
            task.model.size,
            task.model.sha256,
        )
        if task.model.crc32 is not None:
            msg.model_crc32 = task.model.crc32
    return msg


class EncodedTasks:
    """Encoded `Task` messages; a phase's fit and evaluate tasks encoded once per phase
    (their task id names round and phase, their config is the phase's), not per poll."""

    def __init__(self) -> None:
        self._cache: tuple[tuple[Any, ...], bytes] | None = None  # (identity, Task bytes)

    def encode(self, task: TaskInfo) -> bytes:
        """The serialized `Task` for `task`."""
        if task.type not in (TaskType.FIT, TaskType.EVALUATE) or task.secure_stage:
            return task_message(task).SerializeToString()
        model = task.model
        key = (task.type, task.round, task.task_id, model.sha256 if model else "")
        cached = self._cache
        if cached is None or cached[0] != key:
            cached = self._cache = (key, task_message(task).SerializeToString())
        return cached[1]

    def session_reply(self, task: TaskInfo) -> bytes:
        """The `task` SessionReply for `task`."""
        return frame_session(SessionReplyField.TASK, self.encode(task))


class ModelChunks:
    """The current model's `model` SessionReply messages, encoded once for every client.

    Only models up to CACHE_MODEL_BYTES are kept (one extra copy); a download of another
    version, another chunk size or from an offset between chunks reads the file instead.
    """

    def __init__(self, read: Callable[[ModelRecord], bytes], chunk_size: int) -> None:
        """`read(record)`: the model's bytes, checked against its digest."""
        self._read, self.chunk_size = read, chunk_size
        self._lock = threading.Lock()
        self._cache: tuple[tuple[int, str], list[tuple[bytes, int]]] | None = None

    def cacheable(self, record: ModelRecord, offset: int, chunk: int) -> bool:
        """Whether a download is served from the encoded chunks (the server's chunk size,
        an offset on a chunk boundary, a model up to CACHE_MODEL_BYTES)."""
        return chunk == self.chunk_size and not offset % chunk and record.size <= CACHE_MODEL_BYTES

    def chunks(
        self, record: ModelRecord, offset: int, chunk: int, *, fill: bool = True
    ) -> list[tuple[bytes, int]] | None:
        """The (encoded chunk, payload size) pairs of a download from `offset`, when it is
        `cacheable` (and, unless `fill`, already cached); else None: read the file."""
        if not self.cacheable(record, offset, chunk):
            return None
        with self._lock:
            key = (record.version, record.sha256)
            if self._cache is None or self._cache[0] != key:
                if not fill:
                    return None
                data = self._read(record)
                self._cache = (key, encode_model_chunks(data, self.chunk_size, session=True))
            return self._cache[1][offset // chunk :]
