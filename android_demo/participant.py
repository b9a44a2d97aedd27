"""The opt-in federated participant: trains for the fleet only when the policy allows.

A background thread waits until the device policy allows training and the user has
stored enough samples, then runs a federated `Client` whose train/evaluate callables come
from `LiteLearner` (the lite Trainer on the user's samples, head only). While the client
serves rounds, the policy is checked every `check_every` seconds; when it stops allowing
training (the user picks up the phone, unplugs it), the client is stopped after its
current exchange and the participant waits again. When the server runs secure
aggregation, the client answers its stages and uploads only the masked update.

Before each connection the participant checks that the server's address accepts a
connection; while it does not, the state is `unreachable` with the address and the error,
and it tries again with exponential backoff (1 s doubling to `max_backoff`). The state is
`connected` only once the server has registered the client.

The global model the rounds train is not the user's model: personalization and
predictions keep using the user's own file.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import numpy as np

from sporenet import lite
from sporenet.android_demo.policy import DevicePolicy, Sensors
from sporenet.android_demo.store import SampleStore

log = logging.getLogger("sporenet.android_demo.participant")


class ParticipantState(StrEnum):
    """Where the participant is."""

    OFF = "off"
    UNAVAILABLE = "unavailable"
    UNREACHABLE = "unreachable"
    CONNECTING = "connecting"
    WAITING_FOR_POLICY = "waiting_for_policy"
    WAITING_FOR_SAMPLES = "waiting_for_samples"
    CONNECTED = "connected"
    TRAINING = "training"
    DONE = "done"
    FAILED = "failed"


class Participant:
    """Runs federated rounds in the background while the device policy allows."""

    def __init__(
        self,
        address: str,
        model: lite.Model,
        store: SampleStore,
        *,
        policy: DevicePolicy,
        sensors: Sensors,
        trainable: set[str],
        min_samples: int = 10,
        check_every: float = 2.0,
        name: str = "android-demo",
        client_options: dict[str, Any] | None = None,
        unavailable: str = "",
        output: str = "logits",
        max_backoff: float = 60.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.address, self.model, self.store = address, model, store
        self.unavailable, self.output = unavailable, output
        self.max_backoff, self.connect_timeout = max_backoff, connect_timeout
        self.backoff = 1.0
        self.next_attempt: float | None = None  # wall time of the next connection attempt
        self.policy, self.sensors, self.trainable = policy, sensors, trainable
        self.min_samples, self.check_every, self.name = min_samples, check_every, name
        self.client_options = client_options or {}
        self.state = ParticipantState.OFF
        self.rounds_trained = 0
        self.error = ""
        self.final_weights: dict[str, np.ndarray] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def status(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "server": self.address,
            "state": str(self.state),
            "rounds_trained": self.rounds_trained,
            "error": self.error,
            "retry_in": (
                max(0.0, round(self.next_attempt - time.time(), 1))
                if self.next_attempt is not None and self.state == ParticipantState.UNREACHABLE
                else None
            ),
        }

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="federated-participant", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _allowed(self) -> bool:
        return not self.policy.blockers(self.sensors.read())

    def _reachable(self) -> bool:
        """Whether the server's address accepts a TCP connection; if not, the state says
        why and when the next attempt is, and the backoff doubles."""
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection(
                (host.strip("[]") or "127.0.0.1", int(port)), timeout=self.connect_timeout
            ):
                pass
        except (OSError, ValueError) as exc:
            error = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.state = ParticipantState.UNREACHABLE
            self.error = f"cannot reach the server at {self.address}: {error}"
            self.next_attempt = time.time() + self.backoff
            log.warning("%s; retrying in %.0f s", self.error, self.backoff)
            self._stop.wait(self.backoff)
            self.backoff = min(self.backoff * 2, self.max_backoff)
            return False
        self.backoff, self.next_attempt, self.error = 1.0, None, ""
        return True

    def _loop(self) -> None:
        if self.unavailable:
            self.state, self.error = ParticipantState.UNAVAILABLE, self.unavailable
            return
        try:
            while not self._stop.is_set():
                if not self._allowed():
                    self.state = ParticipantState.WAITING_FOR_POLICY
                elif self.store.count() < self.min_samples:
                    self.state = ParticipantState.WAITING_FOR_SAMPLES
                elif not self._reachable():
                    continue
                elif self._serve():
                    self.state = ParticipantState.DONE
                    return
                self._stop.wait(self.check_every)
        except Exception as exc:  # reported in the status; the app keeps serving the user
            log.exception("federated participant failed")
            self.state, self.error = ParticipantState.FAILED, f"{type(exc).__name__}: {exc}"

    def _serve(self) -> bool:
        """Serve rounds until the job ends (True) or the policy or app stops us (False)."""
        from sporenet.federated import Client  # grpc only when opted in
        from sporenet.federated.client.lite_client import LiteLearner

        (x, y), _ = self.store.split()
        learner = LiteLearner(self.model, x, y, trainable=self.trainable, output=self.output)
        train, evaluate = learner.train, learner.evaluate

        def refresh() -> None:  # the latest samples; held-out ones evaluate when there are any
            (learner.x, learner.y), (xe, ye) = self.store.split()
            learner.x_eval, learner.y_eval = (xe, ye) if len(ye) else (learner.x, learner.y)

        def guarded_train(
            weights: Mapping[str, np.ndarray], config: Mapping[str, Any]
        ) -> tuple[dict[str, np.ndarray], int, dict[str, float]]:
            refresh()
            self.state = ParticipantState.TRAINING
            try:
                return train(weights, config)
            finally:
                self.rounds_trained += 1
                self.state = ParticipantState.CONNECTED

        def guarded_evaluate(
            weights: Mapping[str, np.ndarray], config: Mapping[str, Any]
        ) -> tuple[float, int, dict[str, float]]:
            refresh()
            return evaluate(weights, config)

        options = {"name": self.name, "poll_wait": 2.0, **self.client_options}
        client = Client(self.address, train=guarded_train, evaluate=guarded_evaluate, **options)
        stop = threading.Event()
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["weights"] = client.run(stop=stop)
            except Exception as exc:
                result["error"] = exc

        self.state = ParticipantState.CONNECTING
        runner = threading.Thread(target=run, name="federated-client", daemon=True)
        runner.start()
        try:
            checked = time.monotonic()
            while runner.is_alive():
                runner.join(min(self.check_every, 0.2))
                if self.state == ParticipantState.CONNECTING and client.client_id is not None:
                    self.state = ParticipantState.CONNECTED
                if self._stop.is_set():
                    stop.set()
                elif time.monotonic() - checked >= self.check_every:
                    checked = time.monotonic()
                    if not self._allowed():
                        stop.set()
        finally:
            runner.join()
            client.close()
        if "error" in result:
            raise result["error"]
        if result.get("weights") is not None:
            self.final_weights = result["weights"]
            return True
        return False
