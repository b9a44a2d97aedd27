"""How long an idle client waits before it polls again: the server's `retry_after`.

Idle clients poll with a unary call instead of holding a stream open (a held stream
costs the server about as much memory again as the connection under it), so the pause
the server suggests trades how soon a client learns of a new round against the poll
load of the whole fleet. It is short while a round forms (the job waits for clients, or
moves between phases), four times longer for a client a running round did not select
(its next chance is the next round), grows with the fleet so that polls stay near
POLLS_PER_SECOND, is jittered so that a fleet does not poll in step, and stays well
inside `heartbeat_timeout`, so that polling keeps a client live.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from sporenet.federated.server.phases import TaskInfo, TaskType

MIN_PAUSE = 0.25  # seconds: a small fleet learns of a round this soon (on average)
POLLS_PER_SECOND = 200.0  # the fleet's idle poll load the pauses aim for
NOT_SELECTED_FACTOR = 4.0
NOT_SELECTED = "not selected"  # the reason RoundManager gives while a round runs without one
JITTER = 0.5  # a pause is drawn from [1 - JITTER, 1 + JITTER] times its mean


class PollPacer:
    """Chooses the `retry_after` of a TASK_WAIT answer."""

    def __init__(
        self,
        *,
        heartbeat_timeout: float,
        clients: Callable[[], float],
        rng: Callable[[], float] = random.random,
    ) -> None:
        """`clients()`: how many clients may poll (the registered ones); `rng()`: uniform
        in [0, 1), injected so a test draws the pauses it wants."""
        # Two polls per heartbeat_timeout at least, even at the top of the jitter.
        self.ceiling = heartbeat_timeout / (2 * (1 + JITTER))
        self.clients, self.rng = clients, rng

    def mean(self, task: TaskInfo) -> float:
        """The mean pause before the next poll after `task` (0 for a task to do)."""
        if task.type != TaskType.WAIT:
            return 0.0
        pause = max(MIN_PAUSE, self.clients() / POLLS_PER_SECOND)
        if task.reason == NOT_SELECTED:
            pause *= NOT_SELECTED_FACTOR
        return min(pause, self.ceiling)

    def retry_after(self, task: TaskInfo) -> float:
        """The jittered pause the server suggests after `task`."""
        return self.mean(task) * (1 - JITTER + 2 * JITTER * self.rng())
