"""Structured (JSON lines) logs, Prometheus text-format metrics and the operator's status
page for the daemon.

The metrics HTTP server answers /metrics (Prometheus), / (the status page: the job in
words, participants, accuracy and loss per round, privacy, recent events) and
/status.json (what `sporenet-server status --json` prints). The recent events are the
daemon's last log events, kept by a handler `setup_logging` installs.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

LOGGER_NAME = "sporenet.federated.server"
RECENT_EVENTS = 50
"""Log events the status page can show."""


class RecentEvents(logging.Handler):
    """Keeps the last RECENT_EVENTS log events (time, level, event, fields) in memory."""

    def __init__(self) -> None:
        super().__init__()
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECENT_EVENTS)

    def emit(self, record: logging.LogRecord) -> None:
        self._events.append(
            {
                "ts": record.created,
                "level": record.levelname.lower(),
                "event": record.getMessage(),
                "fields": dict(getattr(record, "fields", {})),
            }
        )

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)


RECENT = RecentEvents()
"""The daemon's recent events (one daemon per process)."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, event and the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str) -> logging.Logger:
    """The daemon's logger, writing JSON lines to stderr."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.addHandler(RECENT)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log `event` with structured `fields`."""
    logger.log(level, event, extra={"fields": fields})


class Metrics:
    """Counters and gauges rendered in the Prometheus text exposition format."""

    HELP: ClassVar[dict[str, tuple[str, str]]] = {
        "sporenet_rounds_completed_total": (
            "counter",
            "Federated rounds whose model was published.",
        ),
        "sporenet_rounds_failed_total": (
            "counter",
            "Secure rounds that failed (fewer survivors than the threshold).",
        ),
        "sporenet_current_round": ("gauge", "The round in progress."),
        "sporenet_clients_registered": ("gauge", "Clients registered with the job."),
        "sporenet_sessions_open": ("gauge", "Session streams open (clients at work on a task)."),
        "sporenet_polls_total": ("counter", "Unary task polls answered."),
        "sporenet_round_participants": ("gauge", "Clients selected in the current phase."),
        "sporenet_updates_accepted_total": ("counter", "Updates folded into an aggregate."),
        "sporenet_updates_rejected_total": ("counter", "Updates refused (INVALID_ARGUMENT)."),
        "sporenet_update_cpu_seconds_total": (
            "counter",
            "Thread CPU time taking complete uploads in: checksum, decoding, validation, "
            "journal, fold and status row (the transport's share is the rest).",
        ),
        "sporenet_clients_dropped_total": ("counter", "Selected clients that went silent."),
        "sporenet_clients_excluded_total": (
            "counter",
            "Secure-round clients excluded for a message no honest client sends.",
        ),
        "sporenet_auth_failures_total": ("counter", "Requests refused as UNAUTHENTICATED."),
        "sporenet_bytes_sent_total": ("counter", "Model bytes streamed to clients."),
        "sporenet_bytes_received_total": ("counter", "Update bytes received from clients."),
        "sporenet_round_duration_seconds": ("gauge", "Wall time of the last published round."),
        "sporenet_aggregation_seconds": ("gauge", "Time to aggregate and publish the last round."),
        "sporenet_privacy_epsilon": ("gauge", "Differential privacy spent so far (epsilon)."),
        "sporenet_tick_failures_total": (
            "counter",
            "Round-loop steps that failed and are retried (e.g. a full disk at publish).",
        ),
    }

    def __init__(self) -> None:
        self._values: dict[str, float] = dict.fromkeys(self.HELP, 0.0)
        self._lock = threading.Lock()

    def inc(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self._values[name] += value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._values[name] = value

    def get(self, name: str) -> float:
        with self._lock:
            return self._values[name]

    def render(self) -> str:
        with self._lock:
            lines = []
            for name, (kind, text) in self.HELP.items():
                lines += [
                    f"# HELP {name} {text}",
                    f"# TYPE {name} {kind}",
                    f"{name} {self._values[name]:g}",
                ]
        return "\n".join(lines) + "\n"


def serve_metrics(
    metrics: Metrics, host: str, port: int, *, state_dir: str | Path | None = None
) -> ThreadingHTTPServer:
    """Start an HTTP server answering GET /metrics, and with `state_dir` the status page
    (/) and /status.json, in a daemon thread; returns it (for .port)."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: bytes, content_type: str, code: int = 200) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                self._send(metrics.render().encode(), "text/plain; version=0.0.4")
                return
            if state_dir is None or path not in ("/", "/index.html", "/status.json"):
                known = "/metrics" if state_dir is None else "/, /status.json and /metrics"
                self.send_error(404, f"only {known} are served here")
                return
            from sporenet.federated.errors import ConfigError
            from sporenet.federated.server.status import read_status
            from sporenet.federated.server.status_view import render_page

            try:
                status = read_status(Path(state_dir))
            except ConfigError as e:
                self._send(str(e).encode(), "text/plain; charset=utf-8", 503)
                return
            if path == "/status.json":
                self._send(json.dumps(status, default=str).encode(), "application/json")
                return
            tier = status.get("tier", "server")
            address = (status.get("config") or {}).get("address", "")
            title = f"sporenet-{tier} {address}".strip()
            page = render_page(status, RECENT.events(), title=title)
            self._send(page.encode(), "text/html; charset=utf-8")

        def log_message(self, format: str, *args: Any) -> None:  # keep stderr for JSON logs
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def monotonic() -> float:
    """Seconds on a monotonic clock, for durations (deadlines use wall time: restarts)."""
    return time.monotonic()
