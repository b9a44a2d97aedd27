"""Virtual devices: a group of them in one process, each a real federated Client.

A `DeviceGroup` holds many devices cheaply: each device is its data indices, its traits
and a thread running a `sporenet.federated.Client` (whose gRPC sessions all run as
coroutines on the process's one shared event loop), and all of them train through ONE
`LiteLearner` (one lite Trainer, planned once) whose data is swapped to the device's
partition for its turn. Compute time is the host's time for that training, stretched by
the device's speed multiplier; network time is latency plus bytes over the device's
bandwidth (both slept when the profile simulates time).

Availability: a device with online_fraction < 1 alternates online periods (exponential,
mean `mean_online_s`) and offline ones; offline, its client is closed. A dropout (while
training, or before its update is sent) makes the device vanish for the rest of that
round: its client is closed without an update, and the server sees a silent client.

The group records, per round, when it first saw the round's global weights (the model
published by the round before), how many of its devices trained and dropped out, and the
payload bytes they moved; `run` returns those records (plain data, so a Ray actor can
return them too).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet import lite
from sporenet.android_demo.fleet.profile import DeviceTraits

log = logging.getLogger("sporenet.android_demo.fleet")


class DeviceDropout(Exception):
    """A virtual device vanished in round `round` (raised inside its train callable)."""

    def __init__(self, message: str, round: int) -> None:
        super().__init__(message)
        self.round = round


@dataclass
class RoundRecord:
    """What one group saw of one round."""

    first_seen: float = float("inf")  # time.time() the round's global weights arrived
    trained: int = 0
    dropped_train: int = 0
    dropped_upload: int = 0
    bytes: int = 0


@dataclass
class GroupReport:
    """A group's records: per round, the global weights it first saw, and the end."""

    rounds: dict[int, RoundRecord] = field(default_factory=dict)
    weights: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    final: dict[str, np.ndarray] | None = None
    done_time: float = float("inf")
    offline_periods: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class Device:
    """One virtual device: who it is and what it holds."""

    index: int
    rows: np.ndarray  # indices into the group's data
    traits: DeviceTraits
    rng: np.random.Generator


class DeviceGroup:
    """Many virtual devices in one process, sharing one lite Trainer."""

    def __init__(
        self,
        model: bytes,
        x: np.ndarray,
        y: np.ndarray,
        partitions: list[np.ndarray],
        traits: list[DeviceTraits],
        *,
        first_index: int = 0,
        trainable: set[str] | None = None,
        simulate_time: bool = True,
        seed: int = 0,
        lr: float = 0.05,
        epochs: int = 1,
        batch_size: int = 32,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        from sporenet.federated.client.lite_client import LiteLearner

        if len(partitions) != len(traits):
            raise ValueError(f"{len(partitions)} partitions for {len(traits)} devices")
        self.model_bytes = len(model)
        self.base = lite.parse(model)
        self.x, self.y = x, y
        self.learner = LiteLearner(
            self.base,
            x[partitions[0]],
            y[partitions[0]],
            trainable=trainable,
            lr=lr,
            epochs=epochs,
            batch_size=batch_size,
        )
        self.devices = [
            Device(first_index + k, rows, t, np.random.default_rng([seed, 2, first_index + k]))
            for k, (rows, t) in enumerate(zip(partitions, traits, strict=True))
        ]
        self.simulate_time = simulate_time
        self.client_options = client_options or {}
        self.report = GroupReport()
        self._lock = threading.Lock()  # the shared learner, one device at a time
        self._state = threading.Condition()
        self._latest_round = 0
        self._done = threading.Event()

    # ---- one device's train callable
    def _record(self, rnd: int) -> RoundRecord:
        record = self.report.rounds.get(rnd)
        if record is None:
            record = self.report.rounds[rnd] = RoundRecord()
        return record

    def _train(self, device: Device, weights: dict[str, np.ndarray], config: dict) -> tuple:
        rnd = int(config.get("round", 0))
        now = time.time()
        with self._state:
            record = self._record(rnd)
            if now < record.first_seen:
                record.first_seen = now
                self.report.weights.setdefault(rnd, {k: v.copy() for k, v in weights.items()})
            if rnd > self._latest_round:
                self._latest_round = rnd
                self._state.notify_all()
        traits = device.traits
        if device.rng.random() < traits.dropout_train:
            with self._state:
                record.dropped_train += 1
            raise DeviceDropout(
                f"device {device.index} dropped out while training round {rnd}", rnd
            )
        with self._lock:
            self.learner.x, self.learner.y = self.x[device.rows], self.y[device.rows]
            self.learner.x_eval, self.learner.y_eval = self.learner.x, self.learner.y
            self.learner.rng = device.rng
            start = time.perf_counter()
            new, samples, metrics = self.learner.train(weights, config)
            compute = time.perf_counter() - start
        up = sum(int(np.asarray(v).nbytes) for v in new.values())
        if self.simulate_time:
            wire = 4 * traits.latency_s
            if traits.bandwidth_bps > 0:
                wire += (self.model_bytes + up) / traits.bandwidth_bps
            time.sleep(compute * max(0.0, traits.speed - 1.0) + wire)
        if device.rng.random() < traits.dropout_upload:
            with self._state:
                record.dropped_upload += 1
                record.bytes += self.model_bytes
            raise DeviceDropout(
                f"device {device.index} dropped out before uploading round {rnd}", rnd
            )
        with self._state:
            record.trained += 1
            record.bytes += self.model_bytes + up
        return new, samples, metrics

    def _evaluate(self, device: Device, weights: dict, config: dict) -> tuple:
        with self._lock:
            self.learner.x_eval, self.learner.y_eval = self.x[device.rows], self.y[device.rows]
            return self.learner.evaluate(weights, config)

    # ---- one device's life
    def _online_for(self, device: Device) -> float:
        t = device.traits
        return (
            float("inf")
            if t.online_fraction >= 1
            else float(device.rng.exponential(t.mean_online_s))
        )

    def _offline_for(self, device: Device) -> float:
        t = device.traits
        mean_off = t.mean_online_s * (1 - t.online_fraction) / t.online_fraction
        return float(device.rng.exponential(mean_off)) if mean_off > 0 else 0.0

    def _live(self, device: Device, address: str, stop: threading.Event) -> None:
        from sporenet.federated import Client

        options = {
            "poll_wait": 5.0,
            "give_up_after": 120.0,
            "rpc_timeout": 600.0,
            **self.client_options,
        }
        while not stop.is_set() and not self._done.is_set():
            online_until = time.monotonic() + self._online_for(device)
            leave = threading.Event()
            client = Client(
                address,
                name=f"device-{device.index}",
                train=lambda w, c, d=device: self._train(d, w, c),
                evaluate=lambda w, c, d=device: self._evaluate(d, w, c),
                **options,
            )
            self._leave[device.index] = (leave, online_until)
            try:
                final = client.run(stop=leave)
            except DeviceDropout as exc:
                gone = exc.round
                with self._state:  # gone for the rest of its round, or rejoin_after_s
                    self._state.wait_for(
                        lambda gone=gone: (
                            self._latest_round > gone or self._done.is_set() or stop.is_set()
                        ),
                        timeout=device.traits.rejoin_after_s,
                    )
                continue
            finally:
                self._leave.pop(device.index, None)
                client.close()
            if final is not None:
                with self._state:
                    self.report.final = self.report.final or final
                    self.report.done_time = min(self.report.done_time, time.time())
                self._done.set()
                return
            if stop.is_set() or self._done.is_set():
                return
            with self._state:
                self.report.offline_periods += 1
            stop.wait(self._offline_for(device))

    def run(
        self, address: str, *, timeout: float = 3600.0, stop: threading.Event | None = None
    ) -> GroupReport:
        """Run every device until the server's job ends (or `timeout`); the group's report."""
        stop = stop or threading.Event()
        self._leave: dict[int, tuple[threading.Event, float]] = {}
        errors = self.report.errors

        def live(device: Device) -> None:
            try:
                self._live(device, address, stop)
            except Exception as exc:  # reported, the other devices go on
                log.warning("device %d failed: %r", device.index, exc)
                errors.append(f"device {device.index}: {type(exc).__name__}: {exc}")

        threads = [
            threading.Thread(target=live, args=(d,), daemon=True, name=f"device-{d.index}")
            for d in self.devices
        ]
        for t in threads:
            t.start()
        end = time.monotonic() + timeout
        # One scheduler for the availability traces: ends online periods, watches the end.
        while any(t.is_alive() for t in threads) and time.monotonic() < end:
            now = time.monotonic()
            for leave, until in list(self._leave.values()):
                if now >= until:
                    leave.set()
            if self._done.is_set():
                break
            stop.wait(0.1)
        # The job is over (or timed out) for devices offline or dropped out too.
        stop.set()
        for leave, _ in list(self._leave.values()):
            leave.set()
        with self._state:
            self._state.notify_all()
        for t in threads:
            t.join(max(1.0, end - time.monotonic()))
        return self.report
