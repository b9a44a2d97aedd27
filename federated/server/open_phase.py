"""The phase protocol: what every kind of open phase does (start / submit / tick / close).

Plain fit (plain_fit.py), secure fit (secure_fit.py) and evaluate (evaluate.py) implement
it; the round manager holds the open one in `JobContext.phase` and calls only these
methods, so no code elsewhere asks which kind of phase is open. Each phase checks that
an answer is of its kind and raises StaleTaskError naming what it expects otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from sporenet.federated.aggregation import Weights
from sporenet.federated.server.phases import Phase, TaskInfo


class Tick(StrEnum):
    """What an open phase says at a tick of the round loop."""

    OPEN = "open"  # keep waiting for answers
    CLOSE = "close"  # it has what it needs: aggregate (or summarise) it now
    RETRY = "retry"  # it gave up this run and the job waits to start it again
    FAIL = "fail"  # it cannot complete: `reason` says why


@dataclass(frozen=True)
class TickResult:
    tick: Tick
    reason: str = ""


@dataclass(frozen=True)
class FitResult:
    """A closed fit phase's mean delta, the clipping norm it used (central DP), and what
    the log says about a secure round."""

    delta: Weights
    clipping_norm: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Update:
    """A validated plain update: its tensors (views of `payload`) and what weighs them."""

    tensors: Weights
    num_samples: int
    metrics: dict[str, float]
    payload: memoryview  # the bytes `tensors` view (held until the update is folded)
    crc: int | None = None


@dataclass(frozen=True)
class Evaluation:
    loss: float
    num_samples: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class SecureMessage:
    stage: str
    payload: bytes
    num_samples: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class Withdrawal:
    """The client cannot go on with the secure round it is in."""


Answer = Update | Evaluation | SecureMessage | Withdrawal


class OpenPhase(Protocol):
    """One open phase of the job (see the module docstring)."""

    kind: Phase

    def start(self, now: float, cohort: list[str]) -> None:
        """Begin with `cohort` selected (raises AggregationError when it cannot)."""

    def task(self, client_id: str) -> TaskInfo | None:
        """The task a poll of `client_id` gets now (None: nothing for it, it waits)."""

    def owns(self, client_id: str, task_id: str) -> bool:
        """Whether `task_id` names a task of this phase the client may answer."""

    def wants(self, client_id: str, task_id: str) -> bool:
        """Whether the client's task is still wanted (its heartbeats keep it going)."""

    def answered(self, client_id: str, task_id: str) -> bool:
        """Whether the client's answer to `task_id` was accepted already (a resend)."""

    def accepts(self, client_id: str, answer: type[Answer]) -> None:
        """Raise StaleTaskError unless an answer of this type from the client may count."""

    def submit(self, client_id: str, answer: Answer) -> None:
        """Record an answer (under the lock, after `accepts`)."""

    def tick(self, now: float) -> TickResult:
        """Drop the silent, close stages, ask replacements: whether the phase closes."""

    def close(self) -> FitResult | None:
        """The closed phase's result (a fit phase's delta; None for evaluate)."""

    def save(self, tx: Any) -> None:
        """Persist what a restart needs that is not yet in the store (inside `tx`)."""

    def checkpoint(self) -> None:
        """Persist progress outside the store (an aggregate checkpoint), if any."""

    def follow(self, tx: Any) -> OpenPhase | None:
        """The phase that opens at once when this one is published (inside the publishing
        transaction, after the job moved on): an async job's next buffer; None when
        the job waits to start the next phase (rounds)."""

    def enter(self) -> None:
        """Make the phase `follow` opened current (after its transaction committed)."""

    def stage(self) -> str | None:
        """The secure stage open, for `status` (None for plain phases)."""
