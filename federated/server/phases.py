"""The round state machine's vocabulary: job statuses, phases, participant statuses, tasks.

They are StrEnums, so they compare equal to, and are stored in SQLite and JSON as, their
values: the state a daemon saved reads back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sporenet.federated.server.state import ModelRecord


class JobStatus(StrEnum):
    """Where the job as a whole is."""

    RUNNING = "running"
    FINISHED = "finished"  # every round done, or the privacy budget reached
    FAILED = "failed"  # a round could not complete (the reason says why)


class Phase(StrEnum):
    """The two phases of a round: train (every round) and evaluate (every N rounds)."""

    FIT = "fit"
    EVALUATE = "evaluate"


class Participant(StrEnum):
    """A selected client's status in the open phase."""

    SELECTED = "selected"  # asked to answer; the phase waits for it
    ACCEPTED = "accepted"  # its update or report counts
    REJECTED = "rejected"  # refused MAX_REFUSALS updates: sits out the phase
    DROPPED = "dropped"  # silent past heartbeat_timeout, or left a secure round
    MASKED = "masked"  # secure rounds: sent its masked input, awaiting unmasking
    ABANDONED = "abandoned"  # secure rounds: in a failed run that was started again
    EXCLUDED = "excluded"  # secure rounds: sent a message no honest client sends


class TaskType(StrEnum):
    """What a poll tells a client to do (the wire's TaskType)."""

    WAIT = "wait"
    FIT = "fit"
    EVALUATE = "evaluate"
    DONE = "done"
    SECURE_FIT = "secure_fit"


@dataclass(frozen=True)
class TaskInfo:
    """What a poll answers: the transport turns it into a `Task` message."""

    type: TaskType
    round: int = 0
    task_id: str = ""
    model: ModelRecord | None = None
    config: dict[str, Any] = field(default_factory=dict)
    retry_after: float = 1.0
    reason: str = ""
    # secure_fit only: the protocol stage, the client's RoundSetup and the stage's message.
    secure_stage: str = ""
    secure_setup: bytes = b""
    secure_payload: bytes = b""
