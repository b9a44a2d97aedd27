"""Assemble and run the daemon: gRPC server, health service, metrics endpoint, round loop."""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sporenet.federated.common.auth import Authenticator
from sporenet.federated.common.wire import SERVICE
from sporenet.federated.errors import ConfigError
from sporenet.federated.server.audience import server_audience
from sporenet.federated.server.config import ServerConfig, split_address
from sporenet.federated.server.failure_log import FailureLog
from sporenet.federated.server.interceptor import AuthInterceptor
from sporenet.federated.server.models import write_atomic
from sporenet.federated.server.observability import Metrics, log_event, serve_metrics, setup_logging
from sporenet.federated.server.phases import JobStatus
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.servicer import FederatedServicer, add_to_server
from sporenet.federated.server.session import SessionService
from sporenet.federated.server.slots import transfer_slots

TICK_SECONDS = 0.1
STOP_GRACE_SECONDS = 10.0


def _server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if tls.cert is None or tls.key is None:
        return None
    key, cert = Path(tls.key).read_bytes(), Path(tls.cert).read_bytes()
    client_ca = Path(tls.client_ca).read_bytes() if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


# Allocations from this size up are mapped and unmapped one by one. Above the 512 KiB
# transfer chunks, so the messages that carry them (gRPC's copies, the received bytes)
# reuse heap memory instead of costing a fresh mapping (and a page fault per 4 KiB) each;
# below the multi-megabyte models and updates, so those go back to the OS when freed.
MMAP_THRESHOLD = 1 << 20


def _bound_allocator() -> None:
    """Make glibc return freed payload buffers to the OS (Linux only; a no-op elsewhere).

    By default glibc raises its mmap threshold after the first large free and gives each
    thread its own arena, so chunk- and model-sized buffers freed by 64 RPC threads stay
    resident: peak memory then tracks concurrency instead of the model size.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-8, 2)  # M_ARENA_MAX
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD: fixed (see above)
    except (OSError, AttributeError):
        pass


class _AioServer:
    """The gRPC server on its own asyncio loop thread.

    Polls, Session streams and secure messages are coroutines on that loop; registration,
    evaluation reports and status run on the `max_workers` thread pool (grpc.aio's
    migration pool). The main thread keeps the round loop.
    """

    def __init__(
        self,
        config: ServerConfig,
        servicer: FederatedServicer,
        health_servicer: health.HealthServicer,
        interceptor: AuthInterceptor,
    ) -> None:
        self.config, self.servicer, self.health = config, servicer, health_servicer
        self.interceptor = interceptor
        self.executor = futures.ThreadPoolExecutor(config.max_workers, thread_name_prefix="rpc")
        self.sessions = servicer.sessions
        self._ready: futures.Future[int] = futures.Future()
        self.tls = False  # set when it binds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="grpc-aio", daemon=True)

    def start(self) -> int:
        """Bind and start serving; the bound port (ConfigError if the address is unusable)."""
        self._thread.start()
        return self._ready.result()

    def stop(self, grace: float) -> None:
        """Stop accepting calls, give in-flight ones `grace` seconds, and wait for the end."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(grace + 10.0)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.sessions.executor.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported to start(); after it, logged by the caller
            if not self._ready.done():
                self._ready.set_exception(e)
            else:
                raise

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.sessions.attach(self._loop)
        server = grpc.aio.server(
            migration_thread_pool=self.executor,
            interceptors=[self.interceptor],
            options=[
                ("grpc.so_reuseport", 0),
                # Keep each stream's flow-control window small: otherwise BDP probing grows
                # it to megabytes and every queued upload parks that much data in the
                # server's memory, which then grows with the number of clients.
                ("grpc.http2.bdp_probe", 0),
            ],
        )
        add_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        creds = _server_credentials(self.config)
        self.tls = creds is not None
        address = self.config.address
        try:
            port = (
                server.add_secure_port(address, creds)
                if creds
                else server.add_insecure_port(address)
            )
        except RuntimeError as e:
            raise ConfigError(f"`address`: cannot listen on {address!r}: {e}") from None
        if port == 0:
            raise ConfigError(f"`address`: cannot listen on {address!r} (in use?)")
        # Signed requests must name this server, as clients dial it (audience.py).
        self.interceptor.auth.audience = server_audience(self.config, port)
        await server.start()
        self._ready.set_result(port)
        await self._stop.wait()
        stopped = asyncio.ensure_future(server.stop(STOP_GRACE_SECONDS))
        self.sessions.close_idle()  # after stop(): no new session starts meanwhile
        await stopped


def stop_on_signals(stop: threading.Event | None) -> threading.Event:
    """`stop` (or a new event) that SIGTERM and SIGINT set, so a daemon winds down cleanly.
    Handlers are installed only from the main thread, the one Python lets set them."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop


def run_server(
    config: ServerConfig,
    *,
    stop: threading.Event | None = None,
    manager: RoundManager | None = None,
    metrics: Metrics | None = None,
) -> int:
    """Serve the job until it ends and its clients were told (unless `keep_serving`) or
    it is stopped (SIGTERM/SIGINT or `stop`); the exit code: 1 if the job failed, else 0.

    `manager` (with the `metrics` it reports to) replaces the RoundManager built from
    `config`: the edge aggregator serves its devices with its own round manager.
    """
    _bound_allocator()
    logger = setup_logging(config.log_level)
    if manager is None:
        metrics = Metrics()
        manager = RoundManager(config, metrics=metrics, logger=logger)
    metrics = metrics or manager.metrics
    serving = _Serving.start(config, manager, metrics, logger)
    stop = stop_on_signals(stop)
    code = _tick_until_done(config, manager, metrics, logger, stop)
    serving.stop(manager, logger)
    if threading.current_thread() is threading.main_thread():
        # Stopped: a SIGTERM now (say a supervisor's, as the job ends on its own) must not
        # kill the exiting interpreter, which restores the default action of the handlers
        # above, and turn this exit code into -15.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


class _Serving:
    """The running gRPC server, its health service and the metrics page, if any."""

    def __init__(self, server: _AioServer, health_servicer: Any, http: Any) -> None:
        self.server = server
        self.health_servicer = health_servicer
        self.http = http

    @classmethod
    def start(
        cls, config: ServerConfig, manager: RoundManager, metrics: Metrics, logger: logging.Logger
    ) -> _Serving:
        """Serve the job's gRPC service (and the metrics page), then write server.json."""
        auth = Authenticator(
            tokens=config.auth.tokens,
            token_sha256=config.auth.token_sha256,
            ed25519=config.auth.ed25519,
            max_skew=config.auth.max_skew,
            nonce_file=Path(config.state_dir) / "nonces.json",
        )
        # Messages stay below gRPC's 4 MiB default: payloads move as chunks of `chunk_size`.
        slots = transfer_slots(manager.config, manager.update_bytes)
        sessions = SessionService(
            manager,
            metrics=metrics,
            executor=futures.ThreadPoolExecutor(slots[1] + 1, thread_name_prefix="fold"),
            chunk_size=config.chunk_size,
            slots=slots,
        )
        servicer = FederatedServicer(
            manager, sessions, heartbeat_interval=config.heartbeat_interval
        )
        health_servicer = health.HealthServicer(experimental_non_blocking=True)
        interceptor = AuthInterceptor(auth, metrics=metrics, logger=logger)
        server = _AioServer(config, servicer, health_servicer, interceptor)
        port = server.start()
        for name in ("", SERVICE):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        host = split_address(config.address)[0]
        metrics_port = None
        http = None
        if config.metrics_port is not None:
            http = serve_metrics(metrics, host, config.metrics_port, state_dir=config.state_dir)
            metrics_port = http.server_address[1]
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "address": config.address,
            "port": port,
            "metrics_port": metrics_port,
            "tls": server.tls,
        }
        # Written whole (a rename), so a reader never sees it half written.
        write_atomic(Path(config.state_dir) / "server.json", json.dumps(info).encode())
        log_event(logger, "server_started", **info)
        return cls(server, health_servicer, http)

    def stop(self, manager: RoundManager, logger: logging.Logger) -> None:
        """Report not serving, wake the long-polls, stop serving, close the manager."""
        log_event(logger, "server_stopping")
        for name in ("", SERVICE):
            self.health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        manager.stop()  # wakes long-polls so in-flight calls return
        self.server.stop(STOP_GRACE_SECONDS)
        if self.http is not None:
            self.http.shutdown()
        manager.close()
        log_event(logger, "server_stopped", level=logging.INFO)


def _tick_until_done(
    config: ServerConfig,
    manager: RoundManager,
    metrics: Metrics,
    logger: logging.Logger,
    stop: threading.Event,
) -> int:
    """Tick the rounds until `stop` or the job's end; the exit code (1: the job failed)."""
    # A tick that keeps failing (a full disk at publish) is retried every tick: its
    # cause is logged once, then summarised (failure_log.py).
    failures = FailureLog(
        logger, "tick_failed", metrics=metrics, metric="sporenet_tick_failures_total"
    )
    while not stop.is_set():
        manager.wake.wait(TICK_SECONDS)
        manager.wake.clear()
        try:
            manager.tick()
            failures.succeeded()
        except Exception as e:  # keep serving: one bad round must not take the daemon down
            failures.failed(e)
        if not config.keep_serving and manager.ended_and_told():
            status = manager.job.status
            code = 1 if status == JobStatus.FAILED else 0
            log_event(logger, "job_ended_exiting", status=status, exit_code=code)
            return code
    return 0
