"""Fixtures for the device app: a small trained digits model and the app on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sporenet.android_demo.app import App, AppServer
from tests.integration.federated.helpers import ServerProcess


def run_app(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`python -m sporenet.android_demo ARGS` to its end, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "sporenet.android_demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits MLP trained for a few epochs (about 90% test accuracy), exported once."""
    from sporenet import cloud

    data = cloud.load_digits()
    cloud.manual_seed(0)
    model = cloud.models.digits_mlp(hidden=32)
    cloud.fit(
        model,
        data.x_train,
        data.y_train,
        epochs=5,
        batch_size=32,
        optimizer=cloud.Adam(lr=3e-3),
        seed=0,
        verbose=0,
        mode="graph",
    )
    path = tmp_path_factory.mktemp("model") / "digits.spore"
    cloud.export(model, path, labels=data.labels, input_range=(0.0, 16.0))
    return path


@pytest.fixture(scope="session")
def digits() -> Any:
    from sporenet import cloud

    return cloud.load_digits()


def thicker_strokes(x: np.ndarray) -> np.ndarray:
    """One user's handwriting: strokes dilated a pixel to the right, brighter (as demo.py)."""
    shifted = np.zeros_like(x)
    shifted[..., 1:] = x[..., :-1]
    return np.clip(np.maximum(x, shifted) * 1.5, 0.0, 16.0).astype(np.float32)


class RunningApp:
    """An App behind its real HTTP server on a thread; `call` makes real HTTP requests."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.server = AppServer(app, 0)
        self.url = self.server.url
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def call(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None
    ) -> tuple[int, dict]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(
            self.url.rstrip("/") + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.app.close()


@pytest.fixture
def running_app(digits_model: Path, tmp_path: Path) -> Iterator[RunningApp]:
    running = RunningApp(App(digits_model, tmp_path / "data"))
    yield running
    running.close()


def start_server(
    state_dir: Path, model: Path, *, rounds: int, min_clients: int, extra: list[str] | None = None
) -> ServerProcess:
    """The real sporenet-server daemon, started as the federated tests start it (the one
    place to change if its command line moves)."""
    return ServerProcess(
        state_dir,
        [
            "--model",
            str(model),
            "--rounds",
            str(rounds),
            "--min-clients",
            str(min_clients),
            *(extra or []),
        ],
    ).start()
