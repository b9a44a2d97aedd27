"""What the fleet simulator tells its user while it runs: whether the server is there at
all, and a line per round as the server publishes it.

`wait_for_server` checks that the server's address accepts a connection before any
device starts, saying on each failed attempt which address, what error and when it tries
again (exponential backoff), and gives up after `give_up_after` seconds with
ServerUnreachableError. `RoundMonitor` polls the server's GetStatus on a thread and
prints one line each time a fit round is aggregated (its updates and seconds), and one
line when the server stops answering (and one when it answers again).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sporenet.android_demo.errors import ServerUnreachableError

Say = Callable[[str], None]


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        raise ServerUnreachableError(
            f"the server address must be HOST:PORT, got {address!r}"
        ) from None


def wait_for_server(
    address: str,
    *,
    give_up_after: float,
    say: Say,
    max_backoff: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once `address` accepts a TCP connection.

    Raises:
        ServerUnreachableError: it did not within `give_up_after` seconds.
    """
    host, port = _split(address)
    start, backoff = clock(), 0.5
    while True:
        try:
            with socket.create_connection((host, port), timeout=5.0):
                return
        except OSError as exc:
            error = exc.strerror or str(exc)
        waited = clock() - start
        if waited + backoff > give_up_after:
            raise ServerUnreachableError(
                f"cannot reach the server at {address}: {error} (tried for {waited:.0f} s; "
                "is sporenet-server running there? Omit --server to let the simulator "
                "start one)"
            )
        say(f"cannot reach the server at {address}: {error}; retrying in {backoff:.1f} s")
        sleep(backoff)
        backoff = min(backoff * 2, max_backoff)


class RoundMonitor:
    """Prints a line per aggregated fit round, from the server's GetStatus."""

    def __init__(
        self, address: str, *, rounds: int, devices: int, say: Say, every: float = 0.5
    ) -> None:
        self.address, self.rounds, self.devices, self.say = address, rounds, devices, say
        self.every = every
        self.seen: set[int] = set()
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleet-progress", daemon=True)

    def __enter__(self) -> RoundMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _status(self, stub: Any, pb: Any) -> dict[str, Any]:
        reply = stub.GetStatus(pb.StatusRequest(), timeout=5.0)
        return dict(json.loads(reply.status_json))

    def _loop(self) -> None:
        import grpc

        from sporenet.proto import federated_pb2 as pb
        from sporenet.proto import federated_pb2_grpc as pb_grpc

        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.FederatedStub(channel)
            while True:
                stopped = self._stop.wait(self.every)
                if stopped and self.lost:
                    return
                try:
                    status = self._status(stub, pb)
                except grpc.RpcError as exc:
                    code = exc.code() if hasattr(exc, "code") else None
                    if not self.lost:
                        name = code.name if code is not None else "error"
                        self.say(
                            f"the server at {self.address} does not answer ({name}); the "
                            "devices keep retrying"
                        )
                    self.lost = True
                    if stopped:
                        return
                    continue
                if self.lost:
                    self.say(f"the server at {self.address} answers again")
                    self.lost = False
                self._report(status)
                if stopped:  # one last look, for the round that ended the job
                    return

    def _report(self, status: dict[str, Any]) -> None:
        for row in status.get("rounds", []):
            if row.get("phase") != "fit" or row.get("finished_at") is None:
                continue
            r = int(row["round"])
            if r in self.seen:
                continue
            self.seen.add(r)
            took = float(row["finished_at"]) - float(row.get("started_at") or row["finished_at"])
            self.say(
                f"round {r}/{self.rounds}: {row.get('num_results', 0)} of {self.devices} "
                f"devices' updates aggregated in {took:.1f} s"
            )
