"""Whether a client reaches its server: what it logs and reports while it cannot.

A client (or an edge's upstream participant) retries an unreachable server with backoff.
Silent retries look like a hang, so an outage is reported as a warning naming the address
and gRPC's error once `report_after` calls in a row failed (two by default: one failed
call in a connection burst is not an outage), later failures are summarised every
`summary_every` seconds (attempts, how long, the last error), and the first answer after
a reported outage is reported too. `status()` says the same for an app's or daemon's status page.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

Clock = Callable[[], float]
#: Where an event goes: (event name, logging level, human-readable text, its fields).
Report = Callable[[str, int, str, dict[str, Any]], None]


def text_report(logger: logging.Logger) -> Report:
    """Report events as plain log lines of `logger` (the SDK's default)."""

    def report(event: str, level: int, text: str, fields: dict[str, Any]) -> None:
        logger.log(level, "%s", text)

    return report


class LinkState(StrEnum):
    """Where the client stands with its server."""

    CONNECTING = "connecting"  # no call answered yet
    CONNECTED = "connected"  # the last call was answered
    UNREACHABLE = "unreachable"  # the last calls failed; retrying with backoff


class Reachability:
    """Tracks the calls to the server: logs an outage once, then summaries; `status()`.

    Thread-safe; `clock` is injected so the summaries are testable without sleeping.
    `on_change` (quick, never blocking) is called with `status()` whenever the state,
    address or error changes.
    """

    def __init__(
        self,
        address: str,
        *,
        report: Report,
        report_after: int = 2,
        summary_every: float = 30.0,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.report, self.report_after, self.summary_every = report, report_after, summary_every
        self._reported = False  # whether the current outage was reported
        self.clock, self.wall = clock, wall_clock
        self.on_change = on_change
        self._lock = threading.Lock()
        self.address = address
        self.state = LinkState.CONNECTING
        self.error = ""
        self.attempts = 0  # failed calls in the current outage
        self.retry_in = 0.0
        self._since: float | None = None  # monotonic start of the outage
        self._since_wall: float | None = None
        self._summarised_at = 0.0
        self._summarised_attempts = 0

    def reached(self, address: str) -> None:
        """A call to `address` was answered."""
        with self._lock:
            if self.state == LinkState.CONNECTED and address == self.address:
                return
            was_down = self.state == LinkState.UNREACHABLE and self._reported
            self._reported = False
            outage = self.clock() - self._since if self._since is not None else 0.0
            attempts = self.attempts
            self.address, self.state, self.error = address, LinkState.CONNECTED, ""
            self.attempts, self.retry_in, self._since, self._since_wall = 0, 0.0, None, None
            snapshot = self._status()
        if was_down:
            self.report(
                "server_reachable",
                logging.WARNING,
                f"server {address} reachable again after {outage:.1f} s ({attempts} failed "
                "attempts)",
                {"address": address, "outage_s": round(outage, 3), "attempts": attempts},
            )
        self._changed(snapshot)

    def failed(self, address: str, code: str, details: str, *, retry_in: float) -> None:
        """A call to `address` failed with gRPC status `code` and `details`; the client
        retries in `retry_in` seconds."""
        now = self.clock()
        with self._lock:
            first = self.state != LinkState.UNREACHABLE or address != self.address
            error = f"{code}: {details}" if details else code
            changed = first or error != self.error
            if first:
                self._since, self._since_wall = now, self.wall()
                self.attempts, self._reported = 0, False
            self.address, self.state, self.error = address, LinkState.UNREACHABLE, error
            self.attempts += 1
            self.retry_in = retry_in
            since = self._since if self._since is not None else now
            report = not self._reported and self.attempts >= self.report_after
            if report:
                self._reported = True
                self._summarised_at, self._summarised_attempts = now, self.attempts
            summary = (
                self._reported and not report and now - self._summarised_at >= self.summary_every
            )
            new_attempts = 0
            if summary:
                new_attempts = self.attempts - self._summarised_attempts
                self._summarised_at, self._summarised_attempts = now, self.attempts
            snapshot = self._status()
        fields = {"address": address, "error": error, "attempts": snapshot["attempts"]}
        if report:
            self.report(
                "server_unreachable",
                logging.WARNING,
                f"cannot reach server {address} ({error}); retrying with backoff, next in "
                f"{retry_in:.1f} s",
                {**fields, "retry_in": round(retry_in, 3)},
            )
        elif summary:
            self.report(
                "server_still_unreachable",
                logging.WARNING,
                f"server {address} still unreachable after {now - since:.0f} s "
                f"({snapshot['attempts']} attempts, {new_attempts} since the last report; "
                f"last error {error})",
                {**fields, "for_s": round(now - since, 3)},
            )
        if changed:
            self._changed(snapshot)

    def unreachable_for(self) -> float:
        """Seconds since the current outage began (0 when connected)."""
        with self._lock:
            return self.clock() - self._since if self._since is not None else 0.0

    def status(self) -> dict[str, Any]:
        """The link as JSON: state, address, error, since (unix time), attempts, retry_in."""
        with self._lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "address": self.address,
            "error": self.error,
            "unreachable_since": self._since_wall,
            "attempts": self.attempts,
            "retry_in": round(self.retry_in, 3),
        }

    def _changed(self, snapshot: dict[str, Any]) -> None:
        if self.on_change is not None:
            self.on_change(snapshot)
