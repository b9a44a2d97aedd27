"""Helpers for the device-edge-cloud tests: the edge as a subprocess, deterministic devices,
and the direct (one-tier) FedAvg reference their updates must reproduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.federated import Client, Credentials
from tests.integration.federated.helpers import DaemonProcess, free_port

Weights = dict[str, np.ndarray]

SAMPLES = [5, 10, 20, 40]  # device i's sample count
EDGE_OF = [0, 0, 1, 1]  # devices 0, 1 behind edge 0; devices 2, 3 behind edge 1


class EdgeProcess(DaemonProcess):
    """`python -m sporenet.federated.edge` on a free loopback port, logs to a file."""

    def __init__(self, state_dir: Path, upstream: str, args: list[str]) -> None:
        self.state_dir, self.upstream, self.args = state_dir, upstream, args
        self.address = f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir.parent / f"{state_dir.name}-edge.log"

    def start(self) -> EdgeProcess:
        cmd = [
            sys.executable,
            "-m",
            "sporenet.federated.edge",
            "--upstream",
            self.upstream,
            "--address",
            self.address,
            "--state-dir",
            str(self.state_dir),
            *self.args,
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, env={**os.environ})
        return self

    def wait_serving(self, timeout: float = 120.0) -> None:
        """Return once the edge serves devices: after the cloud's first task brought the
        model (its state dir then holds the daemon's server.json). Devices started before
        would wait out gRPC's reconnection backoff instead."""
        end = time.monotonic() + timeout
        info = self.state_dir / "server.json"
        while time.monotonic() < end:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge exited with {self.proc.returncode}:\n{self.logs()}")
            if info.exists() and json.loads(info.read_text()).get("pid") == self.proc.pid:
                return
            time.sleep(0.05)
        raise TimeoutError(f"edge did not start serving:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def targets(i: int, template: Weights) -> Weights:
    """Device i's deterministic local optimum (what its data pulls the model towards)."""
    rng = np.random.default_rng(100 + i)
    return {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in template.items()}


def local_train(i: int, weights: Weights, config: dict[str, Any]) -> Weights:
    """Two gradient steps on 0.5·||w - t_i||² plus FedProx's (mu/2)·||w - w_global||²."""
    mu = float(config.get("proximal_mu", 0.0))
    lr = 0.3
    out = {}
    for k, w0 in weights.items():
        t = targets(i, weights)[k].astype(np.float64)
        w = w0.astype(np.float64)
        for _ in range(2):
            w = w - lr * ((w - t) + mu * (w - w0))
        out[k] = w.astype(np.float32)
    return out


def fedavg_delta(weights: Weights, samples: list[int], config: dict[str, Any]) -> Weights:
    """The one-tier aggregate: the sample-weighted mean of every device's float32 delta."""
    total = float(sum(samples))
    out = {}
    for k, w in weights.items():
        acc = np.zeros(w.shape, np.float64)
        for i, n in enumerate(samples):
            acc += n * (local_train(i, weights, config)[k] - w).astype(np.float64)
        out[k] = (acc / total).astype(w.dtype)
    return out


def run_devices(
    addresses: list[str],
    samples: list[int],
    *,
    evaluate: bool = False,
    gate: Callable[[int, dict[str, Any]], None] | None = None,
    step: Callable[[int, Weights, dict[str, Any]], Weights] = local_train,
    credentials: Callable[[int], Credentials] | None = None,
) -> tuple[list[threading.Thread], dict[int, Any], list[dict[str, Any]]]:
    """Start one Client per device (device i at addresses[i]); returns the threads, where
    their final weights land, and the task configs they trained with (each with
    `device`). `gate(i, config)` is called before device i trains (to hold it there);
    `step(i, weights, config)` is its training."""
    results: dict[int, Any] = {}
    configs: list[dict[str, Any]] = []

    def run(i: int) -> None:
        def train(weights: Weights, config: dict[str, Any]) -> tuple:
            configs.append({**config, "device": i})
            if gate is not None:
                gate(i, config)
            return step(i, weights, config), samples[i], {"loss": float(i)}

        def evaluate_fn(weights: Weights, config: dict[str, Any]) -> tuple:
            return float(i + 1), samples[i], {"accuracy": 0.1 * i}

        c = Client(
            addresses[i],
            train=train,
            evaluate=evaluate_fn if evaluate else None,
            name=f"d{i}",
            credentials=credentials(i) if credentials is not None else None,
            poll_wait=1.0,
            max_backoff=0.3,
        )
        try:
            results[i] = c.run()
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(samples))]
    for t in threads:
        t.start()
    return threads, results, configs


def run_devices_behind(
    edges: list[EdgeProcess], **kwargs: Any
) -> tuple[list[threading.Thread], dict[int, Any], list[dict[str, Any]]]:
    """`run_devices` for the four devices of SAMPLES, device i behind edges[EDGE_OF[i]]."""
    return run_devices([edges[e].address for e in EDGE_OF], SAMPLES, **kwargs)


def serving(edges: list[EdgeProcess]) -> list[EdgeProcess]:
    """Start the edges, then return them once each serves devices."""
    for edge in edges:
        edge.start()
    for edge in edges:
        edge.wait_serving()
    return edges


def tier_logs(cloud: Any, edges: list[EdgeProcess]) -> Callable[[], str]:
    """The cloud's and the edges' logs, read when a failure shows them."""
    return lambda: cloud.logs() + "".join(e.logs() for e in edges)


def assert_every_device_has(results: dict[int, Any], want: Weights, atol: float = 2e-6) -> None:
    """Every device ended with the model `want`."""
    for got in results.values():
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=atol)


def join_all(threads: list[threading.Thread], timeout: float, logs: Callable[[], str]) -> None:
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), logs()
