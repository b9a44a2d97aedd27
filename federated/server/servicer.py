"""gRPC, translated: decode each call, hand it to the transport-neutral calls, map errors.

The calls themselves live in session.py (polls, Session streams, secure messages, on the
event loop) and here (registration, evaluation reports, status: short calls on the thread
pool), and neither sees a gRPC context; the interceptor has authenticated the caller and
checked what it may act for before a handler runs. What is specific to gRPC is here: the
method table, the request decoders, the `Stream` over a call's context, and the status
code and message of every error.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from sporenet.federated.common.wire import SERVICE, identity
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
from sporenet.federated.server.encoded import task_message
from sporenet.federated.server.interceptor import Refused, caller
from sporenet.federated.server.observability import LOGGER_NAME
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.session import SessionService, ShuttingDown, accepted, require_client
from sporenet.proto import federated_pb2 as pb

__all__ = ["STATUS_CODES", "FederatedServicer", "add_to_server", "status_for", "task_message"]

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
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
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


def decoder(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: gRPC would answer a failed one with a
    generic status; the handler raises MalformedMessageError (INVALID_ARGUMENT) instead."""
    name = message_type.DESCRIPTOR.name

    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as e:  # protobuf's DecodeError, or a RecursionError
            return Refused(
                MalformedMessageError(f"the request is not a valid {name}: {str(e)[:200]}")
            )

    return decode


F = TypeVar("F", bound=Callable[..., Any])


def add_to_server(servicer: FederatedServicer, server: grpc.aio.Server) -> None:
    """Register the service: protobuf requests through `decoder`, the Session stream and
    the Poll reply as raw bytes (the transport frames them itself)."""
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
        "Poll": u(
            servicer.Poll,
            request_deserializer=decoder(pb.TaskRequest),
            response_serializer=identity,
        ),
        "SubmitSecure": grpc.stream_unary_rpc_method_handler(
            servicer.SubmitSecure,
            request_deserializer=decoder(pb.SecureChunk),
            response_serializer=pb.SecureReply.SerializeToString,
        ),
        "Session": grpc.stream_stream_rpc_method_handler(
            servicer.Session, request_deserializer=identity, response_serializer=identity
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def status_for(error: FederatedError) -> grpc.StatusCode:
    return next(code for cls, code in STATUS_CODES if isinstance(error, cls))


def _log_unexpected(name: str, error: Exception) -> tuple[grpc.StatusCode, str]:
    """The status of an error no domain check raised, logged with its traceback (a bad
    request as a warning)."""
    code, message = unexpected_status(error)
    level = logging.WARNING if code == code.INVALID_ARGUMENT else logging.ERROR
    logging.getLogger(LOGGER_NAME).log(level, "%s failed: %s", name, message, exc_info=error)
    return code, message


def _maps_errors(func: F) -> F:
    """Turn errors raised by a thread-pool handler into the matching gRPC status: domain
    errors by STATUS_CODES, anything else by `unexpected_status`."""

    @functools.wraps(func)
    def wrapper(self: FederatedServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return func(self, accepted(request), context)
        except FederatedError as e:
            context.abort(status_for(e), str(e))
        except Exception as e:
            context.abort(*_log_unexpected(func.__name__, e))

    return wrapper  # type: ignore[return-value]


def _maps_errors_async(func: F) -> F:
    """`_maps_errors` for the handlers on the event loop."""

    @functools.wraps(func)
    async def wrapper(self: FederatedServicer, request: Any, context: Any) -> Any:
        try:
            return await func(self, request, context)
        except grpc.aio.AbortError:
            raise
        except FederatedError as e:
            await context.abort(status_for(e), str(e))
        except Exception as e:
            await context.abort(*_log_unexpected(func.__name__, e))
        raise AssertionError("unreachable: abort raises")

    return wrapper  # type: ignore[return-value]


class ContextStream:
    """A streaming call's `Stream` (session.py) over its grpc.aio context."""

    __slots__ = ("_context",)

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context

    async def read(self) -> Any:
        raw = await self._context.read()
        return None if raw is grpc.aio.EOF else raw

    async def write(self, message: bytes) -> None:
        await self._context.write(message)


class FederatedServicer:
    """The Federated service over gRPC: thin handlers over the calls of a SessionService
    (on the event loop) and a RoundManager (the short calls, on the thread pool)."""

    def __init__(
        self, manager: RoundManager, sessions: SessionService, *, heartbeat_interval: float
    ) -> None:
        self.m, self.sessions = manager, sessions
        self.heartbeat_interval = heartbeat_interval

    @_maps_errors
    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterReply:
        client_id = self.m.register(request.client_name, caller(), dict(request.info))
        return pb.RegisterReply(
            client_id=client_id, heartbeat_interval_ms=int(self.heartbeat_interval * 1000)
        )

    @_maps_errors
    def ReportEvaluation(
        self, request: pb.EvaluationReport, context: grpc.ServicerContext
    ) -> pb.EvaluationReply:
        self.m.report_evaluation(
            require_client(request.client_id),
            request.task_id,
            loss=request.loss,
            num_samples=request.num_samples,
            metrics_json=request.metrics_json,
        )
        return pb.EvaluationReply(accepted=True)

    @_maps_errors
    def GetStatus(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return pb.StatusReply(status_json=json.dumps(self.m.status()))

    @_maps_errors_async
    async def Poll(self, request: Any, context: grpc.aio.ServicerContext) -> bytes:
        return await self.sessions.poll(accepted(request))

    @_maps_errors_async
    async def SubmitSecure(
        self, requests: Any, context: grpc.aio.ServicerContext
    ) -> pb.SecureReply:
        return await self.sessions.submit_secure(ContextStream(context))

    @_maps_errors_async
    async def Session(self, requests: Any, context: grpc.aio.ServicerContext) -> None:
        await self.sessions.serve(ContextStream(context))
