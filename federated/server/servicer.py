"""The gRPC servicer: decode, call the RoundManager, map errors to status codes.

It serves the calls outside a client's Session stream (registration, evaluation reports,
secure-aggregation messages, status) and holds what the Session service shares with them:
the caller's identity check, the model's pre-encoded chunks and the receive buffers.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from sporenet.federated.common.buffers import BufferPool
from sporenet.federated.common.wire import (
    SECURE_STAGES,
    SERVICE,
    STAGE_NAMES,
    SessionReplyField,
    encode_model_chunks,
    frame_session,
    identity,
)
from sporenet.federated.errors import (
    AggregationError,
    AuthError,
    ConfigError,
    FederatedError,
    HierarchyError,
    MalformedMessageError,
    ModelDamagedError,
    PermissionDeniedError,
    ReadTimeoutError,
    StaleTaskError,
    SupersededError,
    TransferError,
    UnknownClientError,
    UpdateRejectedError,
)
from sporenet.federated.secagg import ProtocolError, SecAggError, ThresholdError
from sporenet.federated.server.interceptor import caller
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.phases import TaskInfo, TaskType
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.slots import transfer_slots
from sporenet.federated.server.state import ModelRecord
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc

CACHE_MODEL_BYTES = 64 << 20  # models up to this size are served from pre-encoded chunks

# Domain error -> status code; the first matching class wins (subclasses first).
STATUS_CODES: list[tuple[type[FederatedError], grpc.StatusCode]] = [
    (UpdateRejectedError, grpc.StatusCode.INVALID_ARGUMENT),
    (ProtocolError, grpc.StatusCode.INVALID_ARGUMENT),  # a malformed secure message
    (ThresholdError, grpc.StatusCode.FAILED_PRECONDITION),  # the secure round failed
    (SecAggError, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedMessageError, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelDamagedError, grpc.StatusCode.DATA_LOSS),
    (
        SupersededError,
        grpc.StatusCode.ABORTED,
    ),  # the client's newer upload took over  # never served; restore from a backup
    (AuthError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (UnknownClientError, grpc.StatusCode.NOT_FOUND),
    (StaleTaskError, grpc.StatusCode.FAILED_PRECONDITION),
    (HierarchyError, grpc.StatusCode.FAILED_PRECONDITION),  # an edge the job cannot take
    (ReadTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (TransferError, grpc.StatusCode.OUT_OF_RANGE),
    (AggregationError, grpc.StatusCode.INTERNAL),
    (FederatedError, grpc.StatusCode.INTERNAL),
]

# Errors no domain check turned into a FederatedError: malformed input that reached a
# parser (INVALID_ARGUMENT), a full disk (RESOURCE_EXHAUSTED), storage that failed
# (UNAVAILABLE: the call may be retried). Anything else is a server bug: INTERNAL.
MALFORMED_INPUT = (DecodeError, ValueError, RecursionError, OverflowError, UnicodeError)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def unexpected_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and message for an exception a handler did not expect (never UNKNOWN)."""
    what = f"{type(error).__name__}: {str(error)[:200]}"
    if isinstance(error, MALFORMED_INPUT):
        return grpc.StatusCode.INVALID_ARGUMENT, f"malformed request ({what})"
    if isinstance(error, MemoryError) or (
        isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS
    ):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"the server is out of space ({what})"
    if isinstance(error, sqlite3.OperationalError) and "full" in str(error):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"the server is out of space ({what})"
    if isinstance(error, OSError | sqlite3.Error):
        return grpc.StatusCode.UNAVAILABLE, f"the server's storage failed; retry ({what})"
    return grpc.StatusCode.INTERNAL, f"internal server error ({what})"


class Undecodable:
    """A request body that is not a valid message of its type (see `decoder`)."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.error = MalformedMessageError(
            f"the request is not a valid {type_name}: {str(error)[:200]}"
        )


def decoder(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: gRPC would answer a failed one with a
    generic status; the handler raises MalformedMessageError (INVALID_ARGUMENT) instead."""
    name = message_type.DESCRIPTOR.name

    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as e:  # protobuf's DecodeError, or a RecursionError
            return Undecodable(name, e)

    return decode


def checked(request: Any) -> Any:
    """`request`, unless it could not be decoded (MalformedMessageError)."""
    if isinstance(request, Undecodable):
        raise request.error
    return request


TASK_TYPES = {
    TaskType.WAIT: pb.TASK_WAIT,
    TaskType.FIT: pb.TASK_FIT,
    TaskType.EVALUATE: pb.TASK_EVALUATE,
    TaskType.DONE: pb.TASK_DONE,
    TaskType.SECURE_FIT: pb.TASK_SECURE_FIT,
}


F = TypeVar("F", bound=Callable[..., Any])


def add_to_server(
    servicer: FederatedServicer,
    server: grpc.Server | grpc.aio.Server,
    *,
    session: Callable[..., Any] | None = None,
    secure: Callable[..., Any] | None = None,
) -> None:
    """Register the service, with raw-bytes (de)serializers for the payload streams;
    `session` serves the Session RPC (an asyncio handler, see session.py), which is left
    unimplemented without it; `secure` serves SubmitSecure on the same loop (else the
    thread-pool handler below, whose reads have no deadline, serves it)."""
    u = grpc.unary_unary_rpc_method_handler

    def unary(method: Callable[..., Any], req: Any, resp: Any) -> grpc.RpcMethodHandler:
        return u(
            method, request_deserializer=decoder(req), response_serializer=resp.SerializeToString
        )

    handlers = {
        "Register": unary(servicer.Register, pb.RegisterRequest, pb.RegisterReply),
        "ReportEvaluation": unary(
            servicer.ReportEvaluation, pb.EvaluationReport, pb.EvaluationReply
        ),
        "GetStatus": unary(servicer.GetStatus, pb.StatusRequest, pb.StatusReply),
        "SubmitSecure": grpc.stream_unary_rpc_method_handler(
            secure or servicer.SubmitSecure,
            request_deserializer=decoder(pb.SecureChunk),
            response_serializer=pb.SecureReply.SerializeToString,
        ),
    }
    if session is not None:
        handlers["Session"] = grpc.stream_stream_rpc_method_handler(
            session, request_deserializer=identity, response_serializer=identity
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def status_for(error: FederatedError) -> grpc.StatusCode:
    return next(code for cls, code in STATUS_CODES if isinstance(error, cls))


def _maps_errors(func: F) -> F:
    """Turn errors raised by a handler into the matching gRPC status: domain errors by
    STATUS_CODES, anything else by `unexpected_status`, logged with its traceback."""

    @functools.wraps(func)
    def wrapper(self: FederatedServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            if not isinstance(request, Iterator):
                request = checked(request)
            return func(self, request, context)
        except FederatedError as e:
            self._abort(context, e)
        except Exception as e:
            code, message = unexpected_status(e)
            level = logging.WARNING if code == code.INVALID_ARGUMENT else logging.ERROR
            self.log.log(level, "%s failed: %s", func.__name__, message, exc_info=True)
            context.abort(code, message)

    return wrapper  # type: ignore[return-value]


def task_message(task: TaskInfo) -> pb.Task:
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


class FederatedServicer(pb_grpc.FederatedServicer):
    """Thin transport over a RoundManager."""

    def __init__(
        self,
        manager: RoundManager,
        *,
        metrics: Metrics,
        logger: logging.Logger,
        chunk_size: int,
        heartbeat_interval: float,
    ) -> None:
        self.m, self.metrics, self.log = manager, metrics, logger
        self.chunk_size, self.heartbeat_interval = chunk_size, heartbeat_interval
        # `max_transfers` is split between downloads (and secure messages) and uploads;
        # each upload being received holds its update in memory, so big updates get fewer
        # receiving slots.
        self.slots = downloads, uploads = transfer_slots(manager.config, manager.update_bytes)
        self._secure_slots = threading.BoundedSemaphore(downloads)
        self.buffers = BufferPool(uploads)  # the Session uploads' receive buffers
        manager.on_change(self.buffers.clear)  # phases change: no buffer kept over a round
        self._cache_lock = threading.Lock()
        # The current model's pre-encoded Session chunks: ((version, sha256), chunks).
        self._cache: tuple[tuple[int, str], list[tuple[bytes, int]]] | None = None
        # The open phase's encoded task: (its identity, the framed SessionReply).
        self._task_cache: tuple[tuple[Any, ...], bytes] | None = None

    def encoded_task(self, task: TaskInfo) -> bytes:
        """The `task` SessionReply for `task`. A phase's fit and evaluate tasks are the
        same for every client it selected (its task id names its round and phase, and
        its config is the phase's): encoded once per phase, not once per poll."""
        if task.type not in (TaskType.FIT, TaskType.EVALUATE) or task.secure_stage:
            return frame_session(SessionReplyField.TASK, task_message(task).SerializeToString())
        model = task.model
        key = (task.type, task.round, task.task_id, model.sha256 if model else "")
        cached = self._task_cache
        if cached is None or cached[0] != key:
            encoded = task_message(task).SerializeToString()
            cached = self._task_cache = (key, frame_session(SessionReplyField.TASK, encoded))
        return cached[1]

    def _abort(self, context: grpc.ServicerContext, error: FederatedError) -> None:
        context.abort(status_for(error), str(error))

    @staticmethod
    def owned(client_id: str) -> str:
        """`client_id`, if the authenticated caller (if any) may act as it."""
        identity = caller()
        if identity is not None and client_id != identity:
            raise PermissionDeniedError(
                f"authenticated as {identity!r} but the request names client {client_id!r}"
            )
        if not client_id:
            raise UnknownClientError("client_id is empty; call Register first")
        return client_id

    @_maps_errors
    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterReply:
        client_id = self.m.register(request.client_name, caller(), dict(request.info))
        return pb.RegisterReply(
            client_id=client_id, heartbeat_interval_ms=int(self.heartbeat_interval * 1000)
        )

    def download_range(self, cid: str, request: pb.DownloadRequest) -> tuple[ModelRecord, int]:
        """The model a download asks for, and its chunk size, after checking the offset
        (the client is marked alive)."""
        self.m.touch(cid)
        record = self.m.model_record(request.model_version)
        if request.offset > record.size:
            raise TransferError(f"offset {request.offset} is past the model's {record.size} bytes")
        return record, min(request.chunk_size or self.chunk_size, self.chunk_size)

    def cacheable(self, record: ModelRecord, offset: int, chunk: int) -> bool:
        """Whether a download is served from the encoded chunks (the server's chunk size,
        an offset on a chunk boundary, a model up to CACHE_MODEL_BYTES)."""
        return chunk == self.chunk_size and not offset % chunk and record.size <= CACHE_MODEL_BYTES

    def cached_chunks(
        self, record: ModelRecord, offset: int, chunk: int, *, fill: bool = True
    ) -> list[tuple[bytes, int]] | None:
        """The encoded chunks of a download from `offset` in `chunk`-byte pieces, when it
        is `cacheable` (and, unless `fill`, already cached); else None, and the caller
        reads the model file."""
        if not self.cacheable(record, offset, chunk):
            return None
        cached = self._encoded_chunks(record, fill=fill)
        return None if cached is None else cached[offset // chunk :]

    def _encoded_chunks(self, record: ModelRecord, *, fill: bool) -> list[tuple[bytes, int]] | None:
        """The model's `model` SessionReply messages, encoded once for every client, with
        their payload sizes. Only models up to CACHE_MODEL_BYTES are kept (one extra copy)."""
        with self._cache_lock:
            key = (record.version, record.sha256)
            if self._cache is None or self._cache[0] != key:
                if not fill:
                    return None
                data = self.m.models.read(record)  # checked against its digest
                self._cache = (key, encode_model_chunks(data, self.chunk_size, session=True))
            return self._cache[1]

    @_maps_errors
    def ReportEvaluation(
        self, request: pb.EvaluationReport, context: grpc.ServicerContext
    ) -> pb.EvaluationReply:
        cid = self.owned(request.client_id)
        self.m.report_evaluation(
            cid,
            request.task_id,
            loss=request.loss,
            num_samples=request.num_samples,
            metrics_json=request.metrics_json,
        )
        return pb.EvaluationReply(accepted=True)

    @_maps_errors
    def SubmitSecure(
        self, request_iterator: Iterator[pb.SecureChunk], context: grpc.ServicerContext
    ) -> pb.SecureReply:
        request_iterator = (checked(chunk) for chunk in request_iterator)
        with self._secure_slots:
            first = next(request_iterator, None)
            if first is None or not first.HasField("header"):
                raise UpdateRejectedError("the first SecureChunk of a call must carry the header")
            h = first.header
            cid = self.owned(h.client_id)
            stage = STAGE_NAMES.get(h.stage)
            if stage is None:
                raise UpdateRejectedError(f"SecureHeader.stage {h.stage} is not a protocol stage")
            # A masked upload is one ring element per parameter: bound it like an update.
            if h.total_size > self.m.max_update_bytes:
                raise UpdateRejectedError(
                    f"secure message of {h.total_size} bytes; at most "
                    f"{self.m.max_update_bytes} are accepted (max_update_bytes)"
                )
            self.m.touch(cid)
            buf = bytearray(first.data)
            for chunk in request_iterator:
                if len(buf) + len(chunk.data) > h.total_size:
                    raise UpdateRejectedError(
                        f"secure message exceeds the {h.total_size} bytes its header declared"
                    )
                buf += chunk.data
            if h.withdraw:
                self.m.withdraw_secure(cid, h.task_id)
                return pb.SecureReply(accepted=True)
            if len(buf) != h.total_size:
                raise TransferError(f"secure message ended at byte {len(buf)} of {h.total_size}")
            self.metrics.inc("sporenet_bytes_received_total", len(buf))
        self.m.submit_secure(
            cid,
            h.task_id,
            stage,
            bytes(buf),
            num_samples=h.num_samples,
            metrics_json=h.metrics_json,
        )
        return pb.SecureReply(accepted=True)

    @_maps_errors
    def GetStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return pb.StatusReply(status_json=json.dumps(self.m.status()))
