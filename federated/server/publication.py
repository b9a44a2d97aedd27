"""A closed fit phase's publication: prepared once, retried until it is durable.

Publishing a round draws the central-DP noise, runs the server optimizer and works out
what the round costs in privacy; then the model file is written and the store records
the version. When a write fails (a full disk), the daemon tries again on its next
tick. Nothing drawn or charged may happen again on a retry: the first attempt's results
are held here under the phase's task id, each retry goes on from the first step that
has not succeeded, and the privacy ledger takes the charge only once the store has
committed the model version that pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sporenet.federated.server.state import ModelRecord

if TYPE_CHECKING:
    from sporenet.federated.server.ledger import PrivacyLedger


@dataclass
class Publication:
    """What one closed fit phase publishes, computed once."""

    task_id: str
    data: bytes  # the new model's bytes
    moments: dict[str, np.ndarray]  # the server optimizer's state after the round
    secure_info: dict[str, Any]  # what the log says about a secure round
    # The ledger as it will be once the round is published (None without DP), and the
    # round's epsilon and delta for the log.
    charged: PrivacyLedger | None = None
    privacy_info: dict[str, Any] = field(default_factory=dict)
    sample_rate: float = 0.0  # the rate the privacy charge is for
    clients: int = 0  # accepted updates
    summary: dict[str, float] = field(default_factory=dict)  # their weighted metrics
    record: ModelRecord | None = None  # set once the model file is written
    failures: int = 0  # attempts that failed so far
    all_rounds_done: bool = False  # the job finished with this publication


class PublishOnce:
    """Holds at most one publication in progress (the round loop's only)."""

    def __init__(self) -> None:
        self._held: Publication | None = None

    @property
    def pending(self) -> bool:
        """True while a publication is held: its phase takes no more answers."""
        return self._held is not None

    def held(self, task_id: str) -> Publication | None:
        """The publication being retried for `task_id`, if any."""
        held = self._held
        return held if held is not None and held.task_id == task_id else None

    def hold(self, publication: Publication) -> Publication:
        self._held = publication
        return publication

    def release(self) -> None:
        """The publication is durable (or its phase was given up): forget it."""
        self._held = None
