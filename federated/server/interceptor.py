"""Authentication and ownership as a gRPC server interceptor: handlers never see a call
that is not authenticated, nor a request for a client the caller may not act for.

Every call of the Federated service is authenticated from its metadata before its handler
runs (the health service stays open, for probes). A refused call ends UNAUTHENTICATED,
counted and logged here; an accepted one runs its handler with the caller's identity in
`caller()` (None when the server has no authentication configured).

Ownership is checked on the request bytes, before they are decoded: an authenticated
caller may name only itself as the client (`wire.CLIENT_ID_PATHS` says where each call's
messages name one), and a Session stream acts for one client, the first it names. A
refused message reaches the handler as a `Refused` value, which it raises as its error
(PERMISSION_DENIED); bytes that are not protobuf go on to the handler's decoder, which
refuses them as malformed.
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
from sporenet.federated.common.wire import CLIENT_ID_PATHS, SERVICE, named_clients
from sporenet.federated.errors import AuthError, FederatedError, PermissionDeniedError
from sporenet.federated.server.observability import Metrics, log_event

_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)

#: The handler kinds of a grpc.RpcMethodHandler (the attribute that holds its behaviour).
_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


class Refused:
    """A request message refused before its handler saw it: the handler raises `error`."""

    __slots__ = ("error",)

    def __init__(self, error: FederatedError) -> None:
        self.error = error


def _quote(name: bytes) -> str:
    return repr(name[:64].decode("utf-8", errors="replace"))


def owning(
    deserialize: Callable[[bytes], Any] | None,
    paths: tuple[tuple[int, ...], ...],
    identity: str | None,
    *,
    one_client: bool,
) -> Callable[[bytes], Any]:
    """A request deserializer for one call that refuses messages naming a client other
    than `identity` (when authenticated) or, with `one_client`, other than the first
    client the call named; accepted bytes go on to `deserialize`."""
    bound: list[bytes] = [identity.encode()] if identity is not None else []

    def decode(raw: bytes) -> Any:
        # Bytes that are not protobuf are refused by the decoder with its own message.
        for name in named_clients(raw, paths) or ():
            if not bound:
                if one_client:
                    bound.append(name)
                continue
            if name != bound[0]:
                if identity is not None:
                    why = f"authenticated as {identity!r} but the request names client"
                else:
                    why = f"this stream acts for client {_quote(bound[0])}; a request names"
                return Refused(PermissionDeniedError(f"{why} {_quote(name)}"))
        return raw if deserialize is None else deserialize(raw)

    return decode


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
    """Checks the credentials of every call of the Federated service, and that its
    requests act only for the caller's own client (and a stream for one client)."""

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
        handler = _owned(handler, method[len(self._prefix) :], identity)
        if identity is None:  # what caller() says by default: no wrapper per call
            return handler
        return _replace_behaviour(handler, lambda b: _with_identity(b, identity))


def _owned(
    handler: grpc.RpcMethodHandler, name: str, identity: str | None
) -> grpc.RpcMethodHandler:
    """`handler` with the ownership check of method `name` in its request deserializer."""
    paths = CLIENT_ID_PATHS.get(name)
    if paths is None:
        return handler
    one_client = handler.request_streaming  # a stream acts for one client throughout
    if identity is None and not one_client:
        return handler
    deserialize = owning(handler.request_deserializer, paths, identity, one_client=one_client)
    return handler._replace(request_deserializer=deserialize)


def _replace_behaviour(
    handler: grpc.RpcMethodHandler, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> grpc.RpcMethodHandler:
    """`handler` with its behaviour wrapped (grpc's handlers are named tuples)."""
    for kind in _KINDS:
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            return handler._replace(**{kind: wrap(behaviour)})
    return handler
