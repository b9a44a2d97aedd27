"""The gRPC servicer: authenticate, decode, call the RoundManager, map errors to status codes."""

from __future__ import annotations

import collections
import functools
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from sporenet.federated.common.auth import Authenticator
from sporenet.federated.common.buffers import BufferPool
from sporenet.federated.common.wire import (
    SECURE_STAGES,
    STAGE_NAMES,
    encode_model_chunk,
    encode_model_chunks,
    identity,
    parse_upload_chunk,
    split_upload_chunk,
)
from sporenet.federated.errors import (
    AggregationError,
    AuthError,
    ConfigError,
    FederatedError,
    MalformedMessageError,
    PermissionDeniedError,
    StaleTaskError,
    TransferError,
    UnknownClientError,
    UpdateRejectedError,
)
from sporenet.federated.secagg import ProtocolError, SecAggError, ThresholdError
from sporenet.federated.server.observability import Metrics, log_event
from sporenet.federated.server.rounds import (
    ADMIT_WAITERS_PER_SLOT,
    ADMITTED_PER_UPLOAD,
    RoundManager,
    TaskInfo,
)
from sporenet.federated.server.state import ModelRecord
from sporenet.federated.server.upload import UploadReceiver, check_upload_id
from sporenet.proto import federated_pb2 as pb
from sporenet.proto import federated_pb2_grpc as pb_grpc

SERVICE = "sporenet.federated.v1.Federated"
CACHE_MODEL_BYTES = 64 << 20  # models up to this size are served from pre-encoded chunks
# Upload admission (GetUploadOffset): a client is told to stream its update once a slot
# is free, so uploads waiting for a slot wait as a tiny unary call instead of as an open
# stream whose first message gRPC has already buffered in full.
ADMIT_WAIT_SECONDS = 5.0  # longest GetUploadOffset waits for a slot (holding a thread)
RESERVATION_SECONDS = 10.0  # a granted slot waits this long for its UploadUpdate call
BUSY_RETRY_MS = 250  # shortest pause suggested (trailing metadata `retry-after-ms`)
MAX_BUSY_PAUSE_MS = 2000
RATE_WINDOW_SECONDS = 5.0  # upload completions over this window estimate the drain rate
SETTLE_SECONDS = 10.0  # longest a call waits for an earlier call of the same upload to end

# Domain error -> status code; the first matching class wins (subclasses first).
STATUS_CODES: list[tuple[type[FederatedError], grpc.StatusCode]] = [
    (UpdateRejectedError, grpc.StatusCode.INVALID_ARGUMENT),
    (ProtocolError, grpc.StatusCode.INVALID_ARGUMENT),  # a malformed secure message
    (ThresholdError, grpc.StatusCode.FAILED_PRECONDITION),  # the secure round failed
    (SecAggError, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (MalformedMessageError, grpc.StatusCode.INVALID_ARGUMENT),
    (AuthError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (UnknownClientError, grpc.StatusCode.NOT_FOUND),
    (StaleTaskError, grpc.StatusCode.FAILED_PRECONDITION),
    (TransferError, grpc.StatusCode.OUT_OF_RANGE),
    (AggregationError, grpc.StatusCode.INTERNAL),
    (FederatedError, grpc.StatusCode.UNKNOWN),
]

TASK_TYPES = {
    "wait": pb.TASK_WAIT,
    "fit": pb.TASK_FIT,
    "evaluate": pb.TASK_EVALUATE,
    "done": pb.TASK_DONE,
    "secure_fit": pb.TASK_SECURE_FIT,
}


F = TypeVar("F", bound=Callable[..., Any])


def add_to_server(
    servicer: FederatedServicer,
    server: grpc.Server | grpc.aio.Server,
    *,
    session: Callable[..., Any] | None = None,
) -> None:
    """Register the service, with raw-bytes (de)serializers for the payload streams;
    `session` serves the Session RPC (an asyncio handler, see session.py), which is left
    unimplemented without it."""
    u = grpc.unary_unary_rpc_method_handler

    def unary(method: Callable[..., Any], req: Any, resp: Any) -> grpc.RpcMethodHandler:
        return u(
            method, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    handlers = {
        "Register": unary(servicer.Register, pb.RegisterRequest, pb.RegisterReply),
        "GetTask": unary(servicer.GetTask, pb.TaskRequest, pb.Task),
        "Heartbeat": unary(servicer.Heartbeat, pb.HeartbeatRequest, pb.HeartbeatReply),
        "DownloadModel": grpc.unary_stream_rpc_method_handler(
            servicer.DownloadModel,
            request_deserializer=pb.DownloadRequest.FromString,
            response_serializer=identity,
        ),
        "UploadUpdate": grpc.stream_unary_rpc_method_handler(
            servicer.UploadUpdate,
            request_deserializer=identity,
            response_serializer=pb.UploadReply.SerializeToString,
        ),
        "GetUploadOffset": unary(
            servicer.GetUploadOffset, pb.UploadOffsetRequest, pb.UploadOffsetReply
        ),
        "ReportEvaluation": unary(
            servicer.ReportEvaluation, pb.EvaluationReport, pb.EvaluationReply
        ),
        "GetStatus": unary(servicer.GetStatus, pb.StatusRequest, pb.StatusReply),
        "SubmitSecure": grpc.stream_unary_rpc_method_handler(
            servicer.SubmitSecure,
            request_deserializer=pb.SecureChunk.FromString,
            response_serializer=pb.SecureReply.SerializeToString,
        ),
    }
    if session is not None:
        handlers["Session"] = grpc.stream_stream_rpc_method_handler(
            session, request_deserializer=identity, response_serializer=identity
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def method_path(name: str) -> str:
    """The full gRPC method name, which signed requests cover."""
    return f"/{SERVICE}/{name}"


def status_for(error: FederatedError) -> grpc.StatusCode:
    return next(code for cls, code in STATUS_CODES if isinstance(error, cls))


def _maps_errors(func: F) -> F:
    """Turn domain errors raised by a unary handler into the matching gRPC status."""

    @functools.wraps(func)
    def wrapper(self: FederatedServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return func(self, request, context)
        except FederatedError as e:
            self._abort(context, e)

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
        auth: Authenticator,
        metrics: Metrics,
        logger: logging.Logger,
        chunk_size: int,
        heartbeat_interval: float,
    ) -> None:
        self.m, self.auth, self.metrics, self.log = manager, auth, metrics, logger
        self.chunk_size, self.heartbeat_interval = chunk_size, heartbeat_interval
        # A waiting transfer holds a thread but no payload memory. `max_transfers` is split
        # between downloads (and secure messages) and uploads; each upload being received
        # holds its update in memory, so big updates get fewer slots (transfer_slots).
        # `_admitted` counts the uploads allowed to stream: a few per receiving slot, so a
        # slot never idles while the next client connects, and each one waiting for a slot
        # holds one buffered message at most.
        downloads, uploads = manager.transfer_slots()
        self._transfers = threading.BoundedSemaphore(downloads)
        self._uploads = threading.BoundedSemaphore(uploads)
        self.buffers = BufferPool(uploads)  # receive buffers, shared with Session uploads
        manager.on_change(self.buffers.clear)  # phases change: no buffer kept over a round
        self._admitted = threading.BoundedSemaphore(ADMITTED_PER_UPLOAD * uploads)
        # Admission calls that may wait for a grant, holding a thread each.
        self._admission = threading.BoundedSemaphore(ADMIT_WAITERS_PER_SLOT * uploads)
        # (client, upload id) -> monotonic expiry of an upload slot granted to it.
        self._reservations: dict[tuple[str, str], float] = {}
        self._reservations_lock = threading.Lock()
        self._refused: dict[str, float] = {}  # client -> when its admission was last refused
        self._done_times: collections.deque[float] = collections.deque(maxlen=256)
        self._cache_lock = threading.Lock()
        # Uploads being received, by (client, upload id): set when the call has finished.
        self._active: dict[tuple[str, str], threading.Event] = {}
        self._active_lock = threading.Lock()
        # Pre-encoded model chunks, per framing (DownloadModel's, or the Session's).
        self._cache: dict[bool, tuple[tuple[int, str], list[tuple[bytes, int]]]] = {}

    def _abort(self, context: grpc.ServicerContext, error: FederatedError) -> None:
        self.note_refusal(context, error)
        context.abort(status_for(error), str(error))

    def note_refusal(self, context: grpc.ServicerContext, error: FederatedError) -> None:
        """Count and log a refused request (for now, failed authentication)."""
        if isinstance(error, AuthError):
            self.metrics.inc("sporenet_auth_failures_total")
            log_event(
                self.log, "auth_refused", logging.WARNING, peer=context.peer(), reason=str(error)
            )

    def authenticate(self, context: grpc.ServicerContext, method: str) -> str | None:
        return self.auth.authenticate(context.invocation_metadata(), method_path(method))

    def _client(self, context: grpc.ServicerContext, method: str, client_id: str) -> str:
        return self.owned(self.authenticate(context, method), client_id)

    @staticmethod
    def owned(identity: str | None, client_id: str) -> str:
        """`client_id`, if the authenticated caller (if any) may act as it."""
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
        identity = self.authenticate(context, "Register")
        client_id = self.m.register(request.client_name, identity, dict(request.info))
        return pb.RegisterReply(
            client_id=client_id, heartbeat_interval_ms=int(self.heartbeat_interval * 1000)
        )

    @_maps_errors
    def GetTask(self, request: pb.TaskRequest, context: grpc.ServicerContext) -> pb.Task:
        cid = self._client(context, "GetTask", request.client_id)
        return task_message(self.m.get_task(cid, request.wait_ms / 1000.0))

    @_maps_errors
    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatReply:
        cid = self._client(context, "Heartbeat", request.client_id)
        return pb.HeartbeatReply(task_active=self.m.heartbeat(cid, request.task_id))

    def DownloadModel(
        self, request: pb.DownloadRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        try:
            cid = self._client(context, "DownloadModel", request.client_id)
            record, chunk = self.download_range(cid, request)
            offset = request.offset
            cached = self.cached_chunks(record, offset, chunk)
            if cached is not None:
                with self._transfers:
                    for encoded, size in cached:
                        yield encoded
                        self.metrics.inc("sporenet_bytes_sent_total", size)
                return
            with self._transfers, open(self.m.model_path(record), "rb") as f:
                f.seek(offset)
                while offset < record.size:
                    data = f.read(chunk)
                    if not data:
                        break
                    yield encode_model_chunk(offset, data, record.size)
                    offset += len(data)
                    self.metrics.inc("sporenet_bytes_sent_total", len(data))
        except FederatedError as e:
            self._abort(context, e)

    def download_range(self, cid: str, request: pb.DownloadRequest) -> tuple[ModelRecord, int]:
        """The model a download asks for, and its chunk size, after checking the offset
        (the client is marked alive)."""
        self.m.touch(cid)
        record = self.m.model_record(request.model_version)
        if request.offset > record.size:
            raise TransferError(f"offset {request.offset} is past the model's {record.size} bytes")
        return record, min(request.chunk_size or self.chunk_size, self.chunk_size)

    def cached_chunks(
        self, record: ModelRecord, offset: int, chunk: int, *, session: bool = False
    ) -> list[tuple[bytes, int]] | None:
        """The encoded chunks of a download from `offset` in `chunk`-byte pieces, when the
        cache holds them (the server's chunk size, an offset on a chunk boundary); else
        None, and the caller reads the model file."""
        if chunk != self.chunk_size or offset % chunk:
            return None
        cached = self._encoded_chunks(record, session=session)
        return None if cached is None else cached[offset // chunk :]

    def _encoded_chunks(
        self, record: ModelRecord, *, session: bool = False
    ) -> list[tuple[bytes, int]] | None:
        """The model's ModelChunk messages (SessionReply messages when `session`), encoded
        once for every client, with their payload sizes.

        Only models up to CACHE_MODEL_BYTES are kept (one extra copy of the model per kind).
        """
        if record.size > CACHE_MODEL_BYTES:
            return None
        with self._cache_lock:
            cached = self._cache.get(session)
            if cached is None or cached[0] != (record.version, record.sha256):
                data = self.m.model_path(record).read_bytes()
                cached = (
                    (record.version, record.sha256),
                    encode_model_chunks(data, self.chunk_size, session=session),
                )
                self._cache[session] = cached
            return cached[1]

    @_maps_errors
    def UploadUpdate(
        self, request_iterator: Iterator[bytes], context: grpc.ServicerContext
    ) -> pb.UploadReply:
        identity = self.authenticate(context, "UploadUpdate")
        # gRPC has buffered the first message already; reading it costs no memory.
        raw = next(request_iterator, None)
        first = parse_upload_chunk(raw) if raw is not None else None
        if first is None or not first.HasField("header"):
            raise UpdateRejectedError("the first UploadChunk of a call must carry the header")
        h = first.header
        cid = self.owned(identity, h.client_id)
        check_upload_id(h.upload_id)
        # The grant of GetUploadOffset, or (a client that did not ask) the next one; then a
        # receiving slot.
        if not self._take_reservation((cid, h.upload_id)):
            while not self._admitted.acquire(timeout=1.0):
                self._expire_reservations()
        try:
            self._uploads.acquire()
        except BaseException:
            self._admitted.release()
            raise
        try:
            if not self.m.open_upload(cid, h.task_id, h.total_size):
                return pb.UploadReply(
                    accepted=True, received=h.total_size, message="already accepted"
                )
            return self._receive(cid, first, request_iterator)
        finally:
            self._uploads.release()
            self._admitted.release()
            with self._reservations_lock:
                self._done_times.append(time.monotonic())
                self._refused.pop(cid, None)

    def _busy_pause(self, client_id: str) -> int:
        """Milliseconds a refused client should wait: about the time the uploads now
        waiting take to drain at the recent rate, so each comes back about when its turn
        is near instead of polling (the held admission calls keep the slots busy)."""
        now = time.monotonic()
        with self._reservations_lock:
            self._refused[client_id] = now
            if len(self._refused) > 4 * len(self._done_times) + 64:
                self._refused = {c: t for c, t in self._refused.items() if now - t < 10.0}
            waiting = sum(1 for t in self._refused.values() if now - t < 10.0)
            recent = [t for t in self._done_times if now - t < RATE_WINDOW_SECONDS]
        if len(recent) < 8:  # no rate to go by yet: come back soon
            return BUSY_RETRY_MS
        rate = (len(recent) - 1) / max(recent[-1] - recent[0], 1e-3)  # uploads per second
        return int(min(max(1000.0 * waiting / rate / 2, BUSY_RETRY_MS), MAX_BUSY_PAUSE_MS))

    def _take_reservation(self, key: tuple[str, str]) -> bool:
        """Take over the upload slot reserved for `key`, if there is one."""
        self._expire_reservations()
        with self._reservations_lock:
            return self._reservations.pop(key, None) is not None

    def _expire_reservations(self) -> None:
        """Give back the slots of reservations whose upload never came."""
        now = time.monotonic()
        with self._reservations_lock:
            expired = [k for k, t in self._reservations.items() if t < now]
            for k in expired:
                del self._reservations[k]
        for _ in expired:
            self._admitted.release()

    def _admit(self, key: tuple[str, str], context: grpc.ServicerContext) -> None:
        """Reserve an upload slot for `key`, waiting a bounded time; RESOURCE_EXHAUSTED
        (with `retry-after-ms`) when none is free and no thread may be held waiting."""
        self._expire_reservations()
        with self._reservations_lock:
            if key in self._reservations:  # asked again: keep the slot it has
                self._reservations[key] = time.monotonic() + RESERVATION_SECONDS
                return
        got = self._admitted.acquire(blocking=False)
        if not got and self._admission.acquire(blocking=False):
            try:
                got = self._admitted.acquire(timeout=ADMIT_WAIT_SECONDS)
            finally:
                self._admission.release()
        if not got:
            self.metrics.inc("sporenet_upload_admissions_refused_total")
            pause = self._busy_pause(key[0])
            context.set_trailing_metadata((("retry-after-ms", str(pause)),))
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"all upload slots are busy; ask again in about {pause} ms",
            )
        with self._reservations_lock:
            self._reservations[key] = time.monotonic() + RESERVATION_SECONDS

    def _receive(
        self, cid: str, first: pb.UploadChunk, request_iterator: Iterator[bytes]
    ) -> pb.UploadReply:
        """Receive an upload into memory (see upload.py), then submit it; only one call
        at a time receives a given upload (GetUploadOffset reports what the last kept)."""
        h = first.header
        key = (cid, h.upload_id)
        self._settled(key)  # an earlier call of this upload first keeps what it received
        done = threading.Event()
        with self._active_lock:
            self._active[key] = done
        try:
            return self._receive_into_memory(cid, first, request_iterator)
        finally:
            with self._active_lock:
                if self._active.get(key) is done:
                    del self._active[key]
            done.set()

    def _settled(self, key: tuple[str, str]) -> None:
        """Wait (a bounded time) until no call is receiving upload `key`: a broken stream's
        call writes its partial file when it notices the break, and the offset a client
        resumes from must include it."""
        with self._active_lock:
            running = self._active.get(key)
        if running is not None:
            running.wait(SETTLE_SECONDS)

    def _receive_into_memory(
        self, cid: str, first: pb.UploadChunk, request_iterator: Iterator[bytes]
    ) -> pb.UploadReply:
        upload = UploadReceiver(self.m, self.metrics, cid, first.header, self.buffers)
        if first.offset != upload.kept:
            raise TransferError(
                f"upload {first.header.upload_id!r} continues at offset {upload.kept}, "
                f"the call started at {first.offset}"
            )
        rest = (split_upload_chunk(raw) for raw in request_iterator)
        try:
            for at, data in itertools.chain([(first.offset, first.data)], rest):
                upload.add(at, data)
        finally:
            upload.close()
        return upload.submit() if upload.complete else upload.incomplete_reply()

    @_maps_errors
    def GetUploadOffset(
        self, request: pb.UploadOffsetRequest, context: grpc.ServicerContext
    ) -> pb.UploadOffsetReply:
        cid = self._client(context, "GetUploadOffset", request.client_id)
        check_upload_id(request.upload_id)
        key = (cid, request.upload_id)
        self._settled(key)
        path = self.m.upload_path(cid, request.upload_id)
        received = path.stat().st_size if path.exists() else 0
        self._admit(key, context)
        return pb.UploadOffsetReply(received=received)

    @_maps_errors
    def ReportEvaluation(
        self, request: pb.EvaluationReport, context: grpc.ServicerContext
    ) -> pb.EvaluationReply:
        cid = self._client(context, "ReportEvaluation", request.client_id)
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
        identity = self.authenticate(context, "SubmitSecure")
        with self._transfers:
            first = next(request_iterator, None)
            if first is None or not first.HasField("header"):
                raise UpdateRejectedError("the first SecureChunk of a call must carry the header")
            h = first.header
            cid = self.owned(identity, h.client_id)
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
            cid, h.task_id, stage, bytes(buf), num_samples=h.num_samples,
            metrics_json=h.metrics_json,
        )  # fmt: skip
        return pb.SecureReply(accepted=True)

    @_maps_errors
    def GetStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        self.authenticate(context, "GetStatus")
        return pb.StatusReply(status_json=json.dumps(self.m.status()))
