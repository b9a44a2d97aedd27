"""The sporenet-server the fleet simulator starts when it is given no `--server`.

The daemon runs as a subprocess on a free loopback port with a state dir of its own, and
its round settings come from the fleet: a round starts once `min_available` devices are
live (the cohort, or the devices expected online when the profile takes some away), it
samples `fraction` = cohort / devices of them, and aggregates once half the cohort's
updates are in (`min_clients`), so dropouts do not stall it. Without these, the server's
defaults (two clients) start round 1 as soon as the first two devices register.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sporenet.android_demo.errors import AppError

START_TIMEOUT = 120.0
"""Seconds the daemon may take to start (imports are slow on a loaded machine)."""


@dataclass(frozen=True)
class Cohort:
    """How many devices a round waits for, samples and needs."""

    min_available: int
    fraction: float
    min_clients: int

    @classmethod
    def of(cls, devices: int, cohort: int, online_fraction: float) -> Cohort:
        if not 1 <= cohort <= devices:
            raise AppError(f"--cohort must be in [1, {devices}] (the devices), got {cohort}")
        online = max(1, math.floor(devices * min(1.0, online_fraction)))
        available = min(cohort, online)
        return cls(
            min_available=available,
            fraction=min(1.0, cohort / devices),
            min_clients=max(1, math.ceil(available / 2)),
        )

    def flags(self) -> list[str]:
        return [
            "--min-available",
            str(self.min_available),
            "--fraction",
            f"{self.fraction:.6g}",
            "--min-clients",
            str(self.min_clients),
        ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnServer:
    """`python -m sporenet.federated.server` for one simulation; a context manager."""

    def __init__(self, model: Path, state_dir: Path, *, rounds: int, cohort: Cohort) -> None:
        self.model, self.state_dir, self.rounds, self.cohort = model, state_dir, rounds, cohort
        self.address = f"127.0.0.1:{_free_port()}"
        self.log_path = state_dir.parent / f"{state_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sporenet.federated.server",
            "--address",
            self.address,
            "--state-dir",
            str(self.state_dir),
            "--model",
            str(self.model),
            "--rounds",
            str(self.rounds),
            *self.cohort.flags(),
            # The simulator stops it: a daemon that exits once its clients were told would
            # go before the round monitor's last status look, losing the final rounds' lines.
            "--keep-serving",
        ]

    def __enter__(self) -> OwnServer:
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:  # the daemon keeps its own descriptor
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, env={**os.environ})
        end = time.monotonic() + START_TIMEOUT
        info = self.state_dir / "server.json"
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AppError(
                    f"the sporenet-server the simulator started exited with "
                    f"{self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            if info.exists() and json.loads(info.read_text()).get("pid") == self.proc.pid:
                return self
            time.sleep(0.05)
        self.__exit__()
        raise AppError(f"the sporenet-server did not start in {START_TIMEOUT:.0f} s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
