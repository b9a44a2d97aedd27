"""Run an edge: the device-facing daemon and the upstream participant, in one process.

The device-facing side is `run_server` with an EdgeRoundManager's rounds. In a new state dir the
manager is built when the cloud's first task brings the model (devices that connect
before then retry with backoff); after a restart it is built at once from the state dir,
and the upstream participant re-registers under the same name and picks up the task in
hand. When the cloud's job ends, devices get its final model and the edge exits 0 once
every device it knows was told (at most `upstream.linger` seconds later); when the cloud
refuses the edge, it exits 1 with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sporenet.federated.edge.config import EdgeConfig
from sporenet.federated.edge.rounds import EdgeRoundManager
from sporenet.federated.edge.upstream import UpstreamClient
from sporenet.federated.errors import ConfigError, FederatedError
from sporenet.federated.server import state_dir
from sporenet.federated.server.daemon import run_server, stop_on_signals
from sporenet.federated.server.models import write_atomic
from sporenet.federated.server.observability import Metrics, log_event, setup_logging

INITIAL_MODEL = "upstream-initial.spore"
IDENTITY_FILE = "edge.json"
#: The edge's link to the cloud (reachability.Reachability.status), for `status`.
UPSTREAM_FILE = "upstream.json"
#: The longest pause between reconnection attempts to the cloud (edges are few).
UPSTREAM_MAX_BACKOFF = 1.0


class EdgeNode:
    """Holds the edge's round manager, built from the state dir or the first task."""

    def __init__(self, config: EdgeConfig, metrics: Metrics, logger: logging.Logger) -> None:
        self.config, self.metrics, self.log = config, metrics, logger
        self.dir = Path(config.server.state_dir)
        self.manager: EdgeRoundManager | None = None
        self.ready = threading.Event()
        self._lock = threading.Lock()

    def open_existing(self) -> None:
        """Build the manager now if the state dir holds a job (a restart).

        Raises:
            ConfigError: the state dir holds a server's job, not an edge's.
        """
        has_db, is_edge = (self.dir / "state.db").is_file(), (self.dir / INITIAL_MODEL).is_file()
        if has_db and not is_edge:
            raise ConfigError(
                f"--state-dir {str(self.dir)!r} holds a sporenet-server job, not an edge's "
                f"(no {INITIAL_MODEL}): give the edge a state dir of its own"
            )
        if has_db:
            self.manager_for(None)

    def manager_for(self, model: bytes | None) -> EdgeRoundManager:
        """The manager; on the first task, built with the cloud's `model` as version 0."""
        with self._lock:
            if self.manager is None:
                if model is not None and not (self.dir / INITIAL_MODEL).is_file():
                    write_atomic(self.dir / INITIAL_MODEL, model)
                server = dataclasses.replace(self.config.server, model=self.dir / INITIAL_MODEL)
                self.manager = EdgeRoundManager(server, metrics=self.metrics, logger=self.log)
                self.ready.set()
            return self.manager


def edge_name(config: EdgeConfig) -> str:
    """The edge's name at the cloud: configured, or made once and kept in the state dir
    (so a restarted edge is the same participant)."""
    if config.upstream.name:
        return config.upstream.name
    path = Path(config.server.state_dir) / IDENTITY_FILE
    if path.is_file():
        return str(json.loads(path.read_text())["name"])
    name = f"edge-{os.urandom(6).hex()}"
    write_atomic(path, json.dumps({"name": name}).encode())
    return name


def report_upstream(upstream: UpstreamClient, logger: logging.Logger, path: Path) -> None:
    """Log the cloud link's outages as JSON events and keep its state in `path` (what
    `sporenet-server status --state-dir EDGE_DIR` shows as `upstream`)."""

    def report(event: str, level: int, text: str, fields: dict[str, Any]) -> None:
        log_event(logger, f"upstream_{event.removeprefix('server_')}", level, **fields)

    def save(status: dict[str, Any]) -> None:
        try:
            write_atomic(path, json.dumps(status).encode())
        except OSError as e:  # a status file must not stop the edge
            log_event(logger, "upstream_status_unwritable", logging.WARNING, error=str(e))

    upstream.link.report, upstream.link.on_change = report, save
    save(upstream.link.status())


def run_edge(config: EdgeConfig, *, stop: threading.Event | None = None) -> int:
    """Serve devices and take part in the cloud's job until it ends or the edge is stopped."""
    logger = setup_logging(config.server.log_level)
    metrics = Metrics()
    state_dir.prepare(Path(config.server.state_dir))
    # Held from the start, before the cloud's first task builds the round manager.
    lock = state_dir.StateDirLock(Path(config.server.state_dir))
    try:
        return _run_edge(config, logger, metrics, stop)
    finally:
        lock.close()


def _run_edge(
    config: EdgeConfig,
    logger: logging.Logger,
    metrics: Metrics,
    stop: threading.Event | None,
) -> int:
    node = EdgeNode(config, metrics, logger)
    node.open_existing()
    stop = stop_on_signals(stop)
    upstream = UpstreamClient(
        config.upstream.address,
        manager_for=node.manager_for,
        credentials=config.upstream.credentials(),
        name=edge_name(config),
        max_backoff=UPSTREAM_MAX_BACKOFF,
        give_up_after=None,  # a daemon: it retries until stopped, saying so in its log
    )
    report_upstream(upstream, logger, Path(config.server.state_dir) / UPSTREAM_FILE)
    failure: list[BaseException] = []

    def serve_upstream() -> None:
        try:
            final = upstream.run(stop)
            if final is not None and upstream.final_model is not None:
                manager = node.manager_for(upstream.final_model)
                manager.finish(upstream.final_model, "the cloud's job is done")
                log_event(logger, "edge_lingering", seconds=config.upstream.linger)
                end = time.monotonic() + config.upstream.linger
                while not stop.is_set() and (left := end - time.monotonic()) > 0:
                    if manager.all_told_done(min(left, 0.2)):
                        break  # the server's graceful stop finishes their downloads
        except BaseException as e:  # reported by the main thread
            failure.append(e)
        finally:
            stop.set()

    thread = threading.Thread(target=serve_upstream, name="upstream", daemon=True)
    thread.start()
    log_event(logger, "edge_started", upstream=config.upstream.address, name=upstream.name)
    code = 0
    while not stop.is_set() and not node.ready.is_set():
        stop.wait(0.1)
    if node.manager is not None and not failure:
        code = run_server(config.server, stop=stop, manager=node.manager.rounds, metrics=metrics)
    stop.set()
    thread.join(30)
    upstream.close()
    if failure:
        error = failure[0]
        if isinstance(error, FederatedError):
            print(f"sporenet-edge: error: {error}", file=sys.stderr)
            return 2 if isinstance(error, ConfigError) else 1
        raise error
    return code
