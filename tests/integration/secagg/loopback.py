"""A secure-aggregation service on real gRPC (loopback) with its round state in SQLite.

The daemon's proto has no secure-aggregation messages yet, so this harness carries the
protocol's opaque message bytes over three generic bytes-in/bytes-out gRPC methods
(Setup, Poll, Submit). What it exercises is everything around the transport: the server
state machine persisted after every message and transition, a driver that closes a stage
when everyone answered or every missing client went silent, clients in their own threads that go
silent at a chosen stage, and a server restarted from SQLite in the middle of a round.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np

from sporenet.federated.aggregation import Template
from sporenet.federated.secagg import SecAggConfig, SecAggError, Stage
from sporenet.federated.secagg.session import SecureClientSession, SecureRound

SERVICE = "sporenet.secagg.test.SecAgg"
COLLECTING = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)


class SecAggService:
    """Server: one SecureRound, persisted to SQLite (WAL) after every change."""

    def __init__(self, db: Path, *, port: int = 0, silence_s: float = 1.0) -> None:
        self._db = sqlite3.connect(db, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value BLOB)")
        row = self._db.execute("SELECT value FROM state WHERE key='round'").fetchone()
        self.round: SecureRound | None = SecureRound.from_bytes(row[0]) if row else None
        self.failure = ""
        self._lock = threading.Lock()
        self._dead = False
        # A client counts as dropped once it has not called for `silence_s` (live clients
        # poll every 20 ms): the same liveness rule as the daemon's heartbeats.
        self._silence_s = silence_s
        self._started = time.monotonic()
        self._last_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(fn)
            for name, fn in (("Setup", self._setup), ("Poll", self._poll), ("Submit", self._submit))
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self._driver = threading.Thread(target=self._drive, daemon=True)

    def start_round(self, config: SecAggConfig, client_ids: list[str], template: Template) -> None:
        with self._lock:
            self.round = SecureRound.start(config, client_ids=client_ids, template=template)
            self._persist()

    def serve(self) -> None:
        self._server.start()
        self._driver.start()

    def stop(self) -> None:
        """Stop abruptly: no final save, like a crash (every change was already saved).

        Handlers still running in gRPC's pool see `_dead` and touch nothing, so a stale
        server can never overwrite what its successor writes.
        """
        self._stop.set()
        with self._lock:
            self._dead = True
        self._server.stop(grace=None).wait()
        self._driver.join(5)
        with self._lock:
            self._db.close()

    def _persist(self) -> None:
        assert self.round is not None
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO state VALUES ('round', ?)", (self.round.to_bytes(),)
            )

    # ---- RPCs: bytes in, bytes out; domain errors become FAILED_PRECONDITION ----------

    def _check_alive(self, context: grpc.ServicerContext) -> None:
        if self._dead:
            context.abort(grpc.StatusCode.UNAVAILABLE, "server stopped")

    def _setup(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self._check_alive(context)
            self._last_seen[request.decode()] = time.monotonic()
            try:
                assert self.round is not None
                return self.round.setup_payload(request.decode())
            except SecAggError as e:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        raise AssertionError("unreachable")

    def _poll(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        cid = request.decode()
        with self._lock:
            self._check_alive(context)
            self._last_seen[cid] = time.monotonic()
            assert self.round is not None
            stage = self.round.stage
            if stage in COLLECTING and self.round.expects(cid):
                return stage.value.encode() + b"\0" + self.round.payload_for(cid)
            if stage in (Stage.COMPLETED, Stage.FAILED):
                return stage.value.encode() + b"\0"
            return b"wait\0"

    def _submit(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        cid, stage, payload = request.split(b"\0", 2)
        with self._lock:
            self._check_alive(context)
            self._last_seen[cid.decode()] = time.monotonic()
            assert self.round is not None
            try:
                if stage.decode() != self.round.stage.value:
                    raise SecAggError(f"stage {stage.decode()} is closed")
                self.round.submit(cid.decode(), payload)
            except SecAggError as e:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            self._persist()
        return b"ok"

    def _drive(self) -> None:
        """Close a stage when nobody is pending or every pending client has gone silent."""
        while not self._stop.wait(0.02):
            with self._lock:
                r = self.round
                if self._dead or r is None or r.stage not in COLLECTING:
                    continue
                now = time.monotonic()
                silent = all(
                    now - self._last_seen.get(c, self._started) > self._silence_s
                    for c in r.pending()
                )
                if not silent:
                    continue
                try:
                    r.close_stage()
                except SecAggError as e:
                    self.failure = str(e)
                self._persist()


def run_client(
    port_of: callable,
    cid: str,
    template: Template,
    update: Mapping[str, np.ndarray],
    drop_at: Stage | None,
    seed: int,
    timeout_s: float = 60.0,
) -> str:
    """A client in its own thread: poll, answer, go silent at `drop_at`. Returns its end."""
    deadline = time.monotonic() + timeout_s
    channel = None
    port = None
    session = None
    while time.monotonic() < deadline:
        if port != port_of():  # the server restarted (possibly on a new port): reconnect
            port = port_of()
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        assert channel is not None
        call = {m: channel.unary_unary(f"/{SERVICE}/{m}") for m in ("Setup", "Poll", "Submit")}
        try:
            if session is None:
                session = SecureClientSession(
                    call["Setup"](cid.encode(), timeout=5),
                    template,
                    rng=np.random.default_rng(seed),
                )
            stage_name, payload = call["Poll"](cid.encode(), timeout=5).split(b"\0", 1)
            stage_text = stage_name.decode()
            if stage_text in (Stage.COMPLETED.value, Stage.FAILED.value):
                return stage_text
            if stage_text == "wait":
                time.sleep(0.02)
                continue
            stage = Stage(stage_text)
            if drop_at is not None and COLLECTING.index(stage) >= COLLECTING.index(drop_at):
                return "dropped"
            reply = session.respond(stage, payload, update)
            call["Submit"](cid.encode() + b"\0" + stage_text.encode() + b"\0" + reply, timeout=5)
        except grpc.RpcError as e:
            if e.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
            ):
                time.sleep(0.05)  # the server is restarting: retry
                continue
            return f"error: {e.details()}"
    return "timeout"
