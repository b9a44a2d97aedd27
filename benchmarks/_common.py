"""Helpers shared by the benchmark scripts: free ports, the BLAS-clean environment, the
sporenet-server daemon started and read the same way by every federated benchmark, and
the SQNR of a quantized result.

The scripts run as `python benchmarks/NAME.py`, so this module is imported as `_common`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This run's environment without the BLAS overrides (timed subprocesses use the CPU's
    own kernels)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def start_server(
    state: Path,
    model: Path,
    *,
    address: str,
    rounds: int,
    min_clients: int,
    log: Path,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.Popen[bytes]:
    """Start sporenet-server on `address` and return once it wrote state/server.json.

    Rounds never time out and heartbeats are lax, so a slow, busy machine measures the
    protocol, not dropped clients; the server keeps serving after the job (the caller
    stops it). `extra` is appended to the command line. Raises
    RuntimeError with the log's tail (and stops the process) if the server does not come up.
    """
    command = [
        sys.executable,
        "-m",
        "sporenet.federated.server",
        "--address",
        address,
        "--state-dir",
        str(state),
        "--model",
        str(model),
        "--rounds",
        str(rounds),
        "--min-clients",
        str(min_clients),
        "--round-timeout",
        "3600",
        "--heartbeat-interval",
        "30",
        "--heartbeat-timeout",
        "900",
        # The benchmarks read the server's CPU, memory and /metrics after the job.
        "--keep-serving",
        *extra,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=out, env=None if env is None else dict(env)
        )
    end = time.monotonic() + timeout
    while not (state / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"sporenet-server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def round_seconds(log: Path) -> list[float]:
    """Seconds from each round's fit phase start to its publication, from the server's
    JSON-lines log, in round order."""
    starts, ends = {}, {}
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("event") == "phase_started" and e.get("phase") == "fit":
            starts[e["round"]] = e["ts"]
        elif e.get("event") == "round_published":
            ends[e["round"]] = e["ts"]
    return [ends[r] - starts[r] for r in sorted(ends) if r in starts]


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio of `got` against `ref`, in dB (inf if equal).

    NumPy is imported here, not at module level: benchmarks choose the OpenBLAS kernels
    before NumPy loads.
    """
    import numpy as np

    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise))


def timed_fedavg(clients: int, initial: Sequence[np.ndarray]) -> Any:
    """Flower's FedAvg training every one of `clients` each round (no evaluation) from the
    `initial` weights; its round_seconds() gives each round's time from fit start (after
    sampling: all clients connected) to aggregation, in round order. Flower is imported
    here: it is an optional peer of the comparison."""
    import flwr as fl
    from flwr.common import ndarrays_to_parameters

    class TimedFedAvg(fl.server.strategy.FedAvg):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(
                fraction_fit=1.0,
                fraction_evaluate=0.0,
                min_fit_clients=clients,
                min_evaluate_clients=0,
                min_available_clients=clients,
                initial_parameters=ndarrays_to_parameters(list(initial)),
            )
            self.starts: dict[int, float] = {}
            self.ends: dict[int, float] = {}

        def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
            plan = super().configure_fit(server_round, parameters, client_manager)
            self.starts[server_round] = time.time()
            return plan

        def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
            agg = super().aggregate_fit(server_round, results, failures)
            self.ends[server_round] = time.time()
            return agg

        def round_seconds(self) -> list[float]:
            return [self.ends[r] - self.starts[r] for r in sorted(self.ends)]

    return TimedFedAvg()
