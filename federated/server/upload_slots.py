"""The upload receiving slots: how many uploads are received at once, and by whom.

Each upload being received holds its update in memory, so `count` slots bound the
server's upload memory. A slot is held by at most one upload per client: a client's
new upload revokes its earlier one (a client sends one update at a time; the earlier
stream is a zombie or a client hoarding slots), whether that one is receiving or still
waiting. A hold is also revoked when its upload is no longer wanted: the client was
dropped, refused or answered, or the round closed. The receiving loop's pending read
is cancelled when its hold is revoked, and the slot goes back at once.

Runs on the server's event loop; `revoke` and `revoke_unwanted` are called on it too
(the session service hops there from the round manager's threads).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class SlotHold:
    """One upload's claim on a receiving slot (waiting for one, or holding one)."""

    client_id: str
    upload_id: str
    task_id: str
    revoked: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    has_slot: bool = False
    # While it waits: resolved True when a slot is handed to it, False when revoked.
    granted: asyncio.Future[bool] | None = field(default=None, repr=False)
    # While it receives: the pending read, cancelled when the hold is revoked.
    reading: asyncio.Future[Any] | None = field(default=None, repr=False)

    def revoke(self, reason: str) -> None:
        if self.revoked.is_set():
            return
        self.reason = reason
        self.revoked.set()
        if self.granted is not None and not self.granted.done():
            self.granted.set_result(False)
        if self.reading is not None:
            self.reading.cancel()


class UploadSlots:
    """`count` receiving slots, at most one per client (make it on the event loop).

    Waiting uploads queue in arrival order, each on a future of its own that a freed slot
    or a revocation resolves: no task per waiting upload, since under load most wait.
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._queue: deque[SlotHold] = deque()
        self._holds: dict[str, SlotHold] = {}  # client id -> its current upload

    def claim(self, client_id: str, upload_id: str, task_id: str) -> SlotHold:
        """A new upload of `client_id`: its earlier one, if any, is revoked."""
        earlier = self._holds.get(client_id)
        if earlier is not None:
            earlier.revoke(
                f"superseded by upload {upload_id[:64]!r} of the same client: a client "
                "sends one upload at a time"
            )
        hold = self._holds[client_id] = SlotHold(client_id, upload_id, task_id)
        return hold

    @property
    def busy(self) -> bool:
        """True when no slot is free."""
        return self._free == 0

    async def acquire(
        self,
        hold: SlotHold,
        *,
        every: float | None = None,
        waiting: Callable[[], None] | None = None,
    ) -> None:
        """Take a free slot for `hold`, waiting if none is; returns early (without one)
        if the hold is revoked meanwhile. While it waits, `waiting()` is called every
        `every` seconds (a client waiting on its open stream is alive)."""
        if hold.revoked.is_set():
            return
        if self._free > 0:  # a free slot: taken without yielding to the loop
            self._free -= 1
            hold.has_slot = True
            return
        granted = hold.granted = asyncio.get_running_loop().create_future()
        self._queue.append(hold)
        try:
            while not granted.done():
                await asyncio.wait((granted,), timeout=every)
                if not granted.done() and waiting is not None:
                    waiting()
        finally:
            if not granted.done():  # the call ended while waiting: the queue skips it
                granted.cancel()
            hold.granted = None
        if hold.has_slot and hold.revoked.is_set():
            self._give_back(hold)

    def release(self, hold: SlotHold) -> None:
        """The upload ended (for any reason): its slot, if it had one, is free again."""
        self._give_back(hold)
        if self._holds.get(hold.client_id) is hold:
            del self._holds[hold.client_id]

    def _give_back(self, hold: SlotHold) -> None:
        """Hand `hold`'s slot to the first upload still waiting, or free it."""
        if not hold.has_slot:
            return
        hold.has_slot = False
        while self._queue:
            waiter = self._queue.popleft()
            granted = waiter.granted
            if granted is not None and not granted.done():
                waiter.has_slot = True
                granted.set_result(True)
                return
        self._free += 1

    def revoke(self, client_id: str, reason: str) -> None:
        """The client's upload is not wanted any more (dropped, refused, answered)."""
        hold = self._holds.get(client_id)
        if hold is not None:
            hold.revoke(reason)

    def revoke_unwanted(self, wanted: Callable[[str, str], bool], reason: str) -> None:
        """Revoke every hold whose (client, task) `wanted` says is no longer wanted."""
        for hold in list(self._holds.values()):
            if not wanted(hold.client_id, hold.task_id):
                hold.revoke(reason)
