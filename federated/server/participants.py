"""The clients the server knows and, in the open phase, where each selected one stands.

Kept in memory for speed and written through to the store by the round manager, inside
the transaction of the transition that changed it (so a restart rebuilds it from there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from sporenet.federated.server.phases import Participant


class Participants:
    """Liveness of every registered client, and the open phase's participant statuses."""

    def __init__(self) -> None:
        self._last_seen: dict[str, float] = {}  # client id -> clock time of its last call
        # How often a client's last call moved earlier (a restart notes every client seen
        # `resume_grace` ahead): whoever caches when a client may go silent checks this.
        self.rewound = 0
        self._status: dict[str, Participant] = {}  # the open phase's selected clients
        # How many of them hold each status: asked on every update (`waiting`), so kept
        # up to date rather than counted over the phase's clients each time.
        self._counts: Counter[Participant] = Counter()
        self._refusals: dict[str, int] = {}  # updates refused this phase, per client
        self._refusal_reasons: dict[str, str] = {}  # why its last update was refused
        # Told (client id, new status) when a selected client stops being awaited.
        self._on_leave: list[Callable[[str, Participant], None]] = []

    def on_leave(self, listener: Callable[[str, Participant], None]) -> None:
        """Call `listener(client_id, status)` (quick, never blocking) whenever a client the
        open phase awaited stops being awaited (it answered, was dropped or refused)."""
        self._on_leave.append(listener)

    # -- every registered client ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._last_seen)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._last_seen

    def seen(self, client_id: str, now: float) -> None:
        """Note that `client_id` called at `now` (registering it if new)."""
        if now < self._last_seen.get(client_id, now):
            self.rewound += 1  # after a restart's grace: a silence limit moved earlier
        self._last_seen[client_id] = now

    def last_seen(self, client_id: str) -> float:
        """When the client last called (-inf if it never did)."""
        return self._last_seen.get(client_id, float("-inf"))

    def is_silent(self, client_id: str, now: float, timeout: float) -> bool:
        """True when the client has not called within `timeout` seconds of `now`."""
        return self._last_seen.get(client_id, float("-inf")) < now - timeout

    def live(self, now: float, timeout: float) -> list[str]:
        """The clients heard from within `timeout` seconds of `now`, sorted."""
        cutoff = now - timeout
        return sorted(c for c, t in self._last_seen.items() if t >= cutoff)

    # -- the open phase --------------------------------------------------------------------

    def start_phase(self, selected: Iterable[str]) -> None:
        """A new phase: `selected` are asked to answer, and nobody has been refused yet."""
        self._status = dict.fromkeys(selected, Participant.SELECTED)
        self._counts = Counter({Participant.SELECTED: len(self._status)})
        self._refusals, self._refusal_reasons = {}, {}

    def restore_phase(self, statuses: dict[str, str]) -> None:
        """The open phase's statuses, as the store saved them."""
        self._status = {cid: Participant(s) for cid, s in statuses.items()}
        self._counts = Counter(self._status.values())
        self._refusals, self._refusal_reasons = {}, {}

    def end_phase(self) -> None:
        self.start_phase(())

    def status(self, client_id: str) -> Participant | None:
        """The client's status in the open phase (None: not selected)."""
        return self._status.get(client_id)

    def set(self, client_id: str, status: Participant) -> None:
        was = self._status.get(client_id)
        self._status[client_id] = status
        if was is not None:
            self._counts[was] -= 1
        self._counts[status] += 1
        if was == Participant.SELECTED and status != Participant.SELECTED:
            for listener in self._on_leave:
                listener(client_id, status)

    def selected(self) -> list[str]:
        """Every client of the open phase, whatever its status."""
        return list(self._status)

    def with_status(self, *statuses: Participant) -> list[str]:
        """The open phase's clients whose status is one of `statuses`."""
        return [c for c, s in self._status.items() if s in statuses]

    def count(self, status: Participant) -> int:
        return self._counts[status]

    def waiting(self) -> bool:
        """True while some selected client has yet to answer."""
        return self._counts[Participant.SELECTED] > 0

    def counts(self) -> dict[str, int]:
        """How many clients hold each status (for `status`)."""
        out: dict[str, int] = {}
        for s in self._status.values():
            out[s.value] = out.get(s.value, 0) + 1
        return out

    def refused(self, client_id: str, reason: str = "") -> int:
        """Count one more refused update of the client this phase; the count so far."""
        self._refusals[client_id] = self._refusals.get(client_id, 0) + 1
        self._refusal_reasons[client_id] = reason
        return self._refusals[client_id]

    def refusal(self, client_id: str) -> str:
        """Why the client's last update this phase was refused ("" if none was, or the
        phase was restored after a restart)."""
        return self._refusal_reasons.get(client_id, "") or "refused before a restart"
