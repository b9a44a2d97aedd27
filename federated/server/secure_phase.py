"""The open secure fit phase: a SecAgg+ round (secagg/session.py) and who may answer it.

Like secagg/server.py, on which it builds, it does no I/O and reads no clock: the round
manager passes the time in, persists `round.to_bytes()` at every transition and maps the
StaleTaskError it raises to a status code. A stage closes when every client it waits for
has answered, when all of those still missing are silent (or withdrew), or at its deadline.
"""

from __future__ import annotations

from sporenet.federated.aggregation import Template
from sporenet.federated.errors import AggregationError, StaleTaskError
from sporenet.federated.secagg import SecAggConfig, SecAggError, Stage
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.server.participants import Participants

#: The secure stages that collect one message per active client.
COLLECTING = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK)


class SecurePhase:
    """One run of a secure round, its cohort and the open stage's deadline."""

    def __init__(self, secure: SecureRound, *, deadline: float = 0.0) -> None:
        self.round = secure
        self.cohort = frozenset(secure.client_ids)
        self.withdrawn: set[str] = set()  # cohort members that said they cannot go on
        self.deadline = deadline
        # Exclusions already reported (logged, participant marked); a restored round's
        # earlier ones were reported before the restart.
        self._reported: set[str] = set(secure.excluded())

    @classmethod
    def start(
        cls,
        config: SecAggConfig,
        cohort: list[str],
        template: Template,
        *,
        max_weight: float | None,
        deadline: float = 0.0,
    ) -> SecurePhase:
        """A new SecAgg+ round among `cohort`.

        Raises:
            AggregationError: SecAgg+ cannot start with this cohort and configuration.
        """
        try:
            secure = SecureRound.start(
                config, client_ids=cohort, template=template, max_weight=max_weight
            )
        except SecAggError as e:
            raise AggregationError(f"secure aggregation cannot start: {e}") from None
        return cls(secure, deadline=deadline)

    @property
    def stage(self) -> Stage:
        return self.round.stage

    def waiting_reason(self, client_id: str) -> str:
        """Why the client has nothing to send now ('' when the open stage waits for it)."""
        if (
            client_id not in self.cohort
            or client_id in self.withdrawn
            or self.stage not in COLLECTING
        ):
            return "not selected"
        if not self.round.expects(client_id):
            return "next secure stage"
        return ""

    def wants(self, client_id: str) -> bool:
        """True while the client's task (its part in the open stage) is still wanted."""
        return client_id in self.cohort and self.stage in COLLECTING

    def check_message(self, client_id: str, stage: str, task_id: str) -> bool:
        """Whether a client's message for `stage` is to be recorded: False for a resend of
        one already recorded (the client retried after a lost reply).

        Raises:
            StaleTaskError: the stage is closed, or the client is not asked for it.
        """
        if stage != self.stage.value:
            raise StaleTaskError(
                f"secure stage {stage!r} is closed; the round is at {self.stage.value!r}"
            )
        if client_id not in self.cohort:
            raise StaleTaskError(f"client {client_id!r} is not in the secure round {task_id!r}")
        if self.round.expects(client_id):
            return True
        if self.round.index_of(client_id) in self.round.server.active_clients():
            return False
        raise StaleTaskError(
            f"client {client_id!r} was left out of secure round {task_id!r} "
            "(it missed an earlier stage)"
        )

    def newly_excluded(self) -> dict[str, str]:
        """Clients excluded since the last call (client id -> what they sent), e.g. at an
        unmask close for inconsistent shares; each is returned once."""
        new = {c: why for c, why in self.round.excluded().items() if c not in self._reported}
        self._reported |= set(new)
        return new

    def may_close(self, now: float, clients: Participants, heartbeat_timeout: float) -> bool:
        """True when the open stage may close at `now`: nobody it waits for is left who
        is alive and has not withdrawn, or its deadline has passed."""
        pending = self.round.pending()
        if not pending or now >= self.deadline:
            return True
        return all(
            c in self.withdrawn or clients.is_silent(c, now, heartbeat_timeout) for c in pending
        )
