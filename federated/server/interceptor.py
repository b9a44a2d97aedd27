"""Authentication as a gRPC server interceptor: handlers never see an unauthenticated call.

Every call of the Federated service is authenticated from its metadata before its handler
runs (the health service stays open, for probes). A refused call ends UNAUTHENTICATED,
counted and logged here; an accepted one runs its handler with the caller's identity in
`caller()` (None when the server has no authentication configured).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from sporenet.federated.common.auth import Authenticator
from sporenet.federated.common.wire import SERVICE
from sporenet.federated.errors import AuthError
from sporenet.federated.server.observability import Metrics, log_event

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)

#: The handler kinds of a grpc.RpcMethodHandler (the attribute that holds its behaviour).
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def caller() -> str | None:
    """The authenticated identity of the call being handled (None without authentication)."""
    return _CALLER.get()


def _with_identity(behaviour: Callable[..., Any], identity: str | None) -> Callable[..., Any]:
    """`behaviour`, run with `caller()` returning `identity` (same sync- or async-ness)."""
    if inspect.iscoroutinefunction(behaviour):

        @functools.wraps(behaviour)
        async def run_async(request: Any, context: Any) -> Any:
            _CALLER.set(identity)
            return await behaviour(request, context)

        return run_async

    @functools.wraps(behaviour)
    def run(request: Any, context: Any) -> Any:
        token = _CALLER.set(identity)
        try:
            return behaviour(request, context)
        finally:
            _CALLER.reset(token)

    return run


def _refusal(behaviour: Callable[..., Any], message: str) -> Callable[..., Any]:
    """A behaviour of the same kind as `behaviour` that ends the call UNAUTHENTICATED."""
    if inspect.iscoroutinefunction(behaviour):

        async def refuse_async(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        return refuse_async

    def refuse(request: Any, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return refuse


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks the credentials of every call of the Federated service."""

    def __init__(self, auth: Authenticator, *, metrics: Metrics, logger: logging.Logger) -> None:
        self.auth, self.metrics, self.log = auth, metrics, logger
        self._prefix = f"/{SERVICE}/"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(self._prefix):
            return handler
        metadata = handler_call_details.invocation_metadata
        try:
            identity = self.auth.authenticate(metadata, method)
        except AuthError as e:
            reason = str(e)
            self.metrics.inc("sporenet_auth_failures_total")
            log_event(self.log, "auth_refused", logging.WARNING, method=method, reason=reason)
            return _replace_behaviour(handler, lambda b: _refusal(b, reason))
        return _replace_behaviour(handler, lambda b: _with_identity(b, identity))


def _replace_behaviour(
    handler: grpc.RpcMethodHandler, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> grpc.RpcMethodHandler:
    """`handler` with its behaviour wrapped (grpc's handlers are named tuples)."""
    for kind in _KINDS:
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            return handler._replace(**{kind: wrap(behaviour)})
    return handler
