"""The device app: the page, the JSON API and the state behind them, on 127.0.0.1.

`App` holds the user's model, their sample store, the personalization progress and the
optional federated participant; `serve` runs it behind the standard library's threaded
HTTP server (one thread per request, so the page can poll the status while a
personalization runs).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sporenet.android_demo import api
from sporenet.android_demo.errors import (
    AppError,
    BadRequestError,
    ConflictError,
    NotEnoughSamplesError,
    PersonalizationUnavailableError,
)
from sporenet.android_demo.model import DeviceModel
from sporenet.android_demo.page import FAVICON, PAGE
from sporenet.android_demo.participant import Participant
from sporenet.android_demo.policy import DevicePolicy, Sensors, describe
from sporenet.android_demo.store import SampleStore

HOST = "127.0.0.1"
"""The app listens on loopback only: the page and API are for the phone's own browser."""
MIN_SAMPLES = 5
"""Samples needed to personalize (at least one lands in the held-out set)."""

log = logging.getLogger("sporenet.android_demo")


class App:
    """The app's state: model, samples, personalization, federated participation."""

    def __init__(
        self,
        model_path: Path,
        data_dir: Path,
        *,
        server: str | None = None,
        policy: DevicePolicy | None = None,
        sensors: Sensors | None = None,
        client_options: dict[str, Any] | None = None,
        num_threads: int = 1,
    ) -> None:
        if data_dir.exists() and not data_dir.is_dir():
            raise AppError(f"the data dir {str(data_dir)!r} is a file; give a directory")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.model = DeviceModel(model_path, data_dir, num_threads=num_threads)
        self.store = SampleStore(data_dir / "samples.db")
        self.classes = self.model.classes
        self.policy = policy or DevicePolicy()
        self.sensors = sensors or Sensors()
        self._personalizing = threading.Lock()
        self.progress: dict[str, Any] = {
            "running": False,
            "epoch": 0,
            "epochs": 0,
            "loss": None,
            "last": None,
            "error": None,
        }
        self.participant: Participant | None = None
        if server is not None:
            self.participant = Participant(
                server,
                self.model.base,
                self.store,
                policy=self.policy,
                sensors=self.sensors,
                trainable=set(self.model.head.names),
                client_options=client_options,
                unavailable=self.model.federated_reason,
                output=self.model.output,
            )

    def start(self) -> None:
        if self.participant is not None:
            self.participant.start()

    def close(self) -> None:
        if self.participant is not None:
            self.participant.stop()
        self.store.close()

    def personalize(self, epochs: int) -> dict[str, Any]:
        if not self.model.head.available:
            raise PersonalizationUnavailableError(self.model.head.reason)
        (x, y), (xh, yh) = self.store.split()
        if len(y) + len(yh) < MIN_SAMPLES or not len(yh) or not len(y):
            raise NotEnoughSamplesError(
                f"personalization needs at least {MIN_SAMPLES} stored samples (some are held "
                f"out to measure it); the store has {len(y) + len(yh)}"
            )
        if not self._personalizing.acquire(blocking=False):
            raise ConflictError("a personalization is already running; wait for it to end")
        try:
            self.progress.update(running=True, epoch=0, epochs=epochs, loss=None, error=None)

            def progress(epoch: int, total: int, loss: float) -> None:
                self.progress.update(epoch=epoch, epochs=total, loss=loss)

            try:
                before, after = self.model.personalize(
                    x, y, xh, yh, epochs=epochs, progress=progress
                )
            except Exception as exc:  # the page's poll shows it beside the button too
                self.progress["error"] = f"{type(exc).__name__}: {exc}"
                raise
            result = {"before": before, "after": after, "samples": len(y), "held_out": len(yh)}
            self.progress["last"] = result
            return result
        finally:
            self.progress["running"] = False
            self._personalizing.release()

    def status(self) -> dict[str, Any]:
        state = self.sensors.read()
        federated: dict[str, Any] = {"enabled": False, "state": "off"}
        if self.participant is not None:
            federated = self.participant.status()
        federated["device"] = describe(self.policy, state)
        return {
            "model": {
                "version": self.model.version,
                "personalized": self.model.personalizations > 0,
                **self.model.describe(),
            },
            "samples": self.store.count(),
            "personalization": dict(self.progress),
            "federated": federated,
        }


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as null: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class Handler(BaseHTTPRequestHandler):
    """Routes GET / to the page and /api/* to api.ROUTES; bad requests get 400 + JSON."""

    server: AppServer
    protocol_version = "HTTP/1.1"  # keep-alive: the page's requests reuse one connection
    timeout = 30.0  # a client that sends less body than it announced is dropped

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def setup(self) -> None:
        super().setup()
        # Small responses go out at once: with Nagle's algorithm a reply written after its
        # headers waits for the client's delayed ACK (about 40 ms per request).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: dict[str, Any]) -> None:
        body = json.dumps(_finite(value), allow_nan=False).encode()
        self._send(status, body, "application/json")

    def _handle(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if method == "GET" and path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, PAGE.encode(), "text/html; charset=utf-8")
            return
        if method == "GET" and path in ("/favicon.ico", "/favicon.svg"):
            self._send(HTTPStatus.OK, FAVICON.encode(), "image/svg+xml")
            return
        route = api.ROUTES.get((method, path))
        if route is None:
            known = sorted({p for _, p in api.ROUTES})
            status = (
                HTTPStatus.METHOD_NOT_ALLOWED
                if any(p == path for _, p in api.ROUTES)
                else HTTPStatus.NOT_FOUND
            )
            self._json(status, {"error": f"no {method} {path}; the API is {known}"})
            return
        app = self.server.app
        if path != "/api/status":
            app.sensors.touch()  # the user is using the app: not idle
        try:
            request: dict[str, Any] = {}
            if method == "POST":
                request = api.parse_body(self._body())
            self._json(HTTPStatus.OK, route(app, request))
        except BadRequestError as exc:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except ConflictError as exc:
            self._json(HTTPStatus.CONFLICT, {"error": str(exc)})
        except Exception as exc:  # a fault of the app, not of the request: say what it was
            log.exception("%s %s failed", method, path)
            self._json(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": f"internal error: {type(exc).__name__}: {exc}"},
            )

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequestError("a POST needs a Content-Length header")
        if int(length) > api.MAX_BODY:
            raise BadRequestError(f"the body is {length} bytes; at most {api.MAX_BODY}")
        return self.rfile.read(int(length))

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


class AppServer(ThreadingHTTPServer):
    """The HTTP server bound to 127.0.0.1, carrying the App."""

    daemon_threads = True

    def __init__(self, app: App, port: int = 0) -> None:
        self.app = app
        super().__init__((HOST, port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is logged quietly, not as a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("client %s went away", client_address)
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"
