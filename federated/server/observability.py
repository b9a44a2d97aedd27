"""Structured (JSON lines) logs and Prometheus text-format metrics for the daemon."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

LOGGER_NAME = "sporenet.federated.server"


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
        "sporenet_round_participants": ("gauge", "Clients selected in the current phase."),
        "sporenet_updates_accepted_total": ("counter", "Updates folded into an aggregate."),
        "sporenet_updates_rejected_total": ("counter", "Updates refused (INVALID_ARGUMENT)."),
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


def serve_metrics(metrics: Metrics, host: str, port: int) -> ThreadingHTTPServer:
    """Start an HTTP server answering GET /metrics in a daemon thread; returns it (for .port)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # keep stderr for JSON logs
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server


def monotonic() -> float:
    """Seconds on a monotonic clock, for durations (deadlines use wall time: restarts)."""
    return time.monotonic()
