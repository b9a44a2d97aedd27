"""Repeated failures of one kind: logged once with their cause, then summarised.

The daemon retries a failed tick ten times a second (a full disk at publish, a store
that cannot write). A traceback per retry buries the cause and fills the disk further:
the first failure of a kind is logged with its traceback, repeats are counted and
summarised every `summary_every` seconds, and the first success after them says how
long it lasted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sporenet.federated.server.observability import Metrics, log_event


def failure_kind(error: BaseException) -> tuple[str, Any]:
    """What makes two failures the same: the exception type and, for an OSError, its
    errno (paths and byte counts in the message vary), otherwise its message."""
    if isinstance(error, OSError) and error.errno is not None:
        return type(error).__name__, error.errno
    return type(error).__name__, str(error)


class FailureLog:
    """Logs `event` for the first failure of a kind, `{event}_repeating` summaries and
    `{event}_recovered`; counts every failure in `metric`."""

    def __init__(
        self,
        logger: logging.Logger,
        event: str,
        *,
        metrics: Metrics | None = None,
        metric: str = "",
        summary_every: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.event, self.metrics, self.metric = logger, event, metrics, metric
        self.summary_every, self.clock = summary_every, clock
        self._kind: tuple[str, Any] | None = None
        self._count = 0  # failures since the last success
        self._since = 0.0
        self._summarised = (0.0, 0)  # when, at which count

    def failed(self, error: BaseException) -> None:
        """Record a failure (call it from the `except` block: the first is logged with
        its traceback)."""
        now = self.clock()
        if self.metrics is not None and self.metric:
            self.metrics.inc(self.metric)
        kind = failure_kind(error)
        if self._count == 0:
            self._since = now
        self._count += 1
        if kind != self._kind:
            self._kind, self._summarised = kind, (now, self._count)
            self.log.error(
                self.event,
                exc_info=error,
                extra={"fields": {"error": f"{type(error).__name__}: {error}", "repeats": 0}},
            )
            return
        at, count = self._summarised
        if now - at >= self.summary_every:
            self._summarised = (now, self._count)
            log_event(
                self.log,
                f"{self.event}_repeating",
                logging.ERROR,
                error=f"{type(error).__name__}: {error}",
                failures=self._count,
                since_last_report=self._count - count,
                for_s=round(now - self._since, 3),
            )

    def succeeded(self) -> None:
        """The step worked: end the run of failures (logged if there was one)."""
        if self._count == 0:
            return
        log_event(
            self.log,
            f"{self.event}_recovered",
            logging.WARNING,
            failures=self._count,
            for_s=round(self.clock() - self._since, 3),
        )
        self._count, self._kind = 0, None
