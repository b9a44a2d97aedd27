"""The upload receiving slots: how many uploads are received at once, and by whom.

Each upload being received holds its update in memory, so `count` slots bound the
server's upload memory. A slot is held by at most one upload per client: a client's
new upload revokes its earlier one (a client sends one update at a time; the earlier
stream is a zombie or a client hoarding slots), whether that one is receiving or still
waiting. A hold is also revoked when its upload is no longer wanted: the client was
dropped, refused or answered, or the round closed. The receiving loop watches its
hold's `revoked` event and gives the slot back at once.

Runs on the server's event loop; `revoke` and `revoke_unwanted` are called on it too
(the session service hops there from the round manager's threads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class SlotHold:
    """One upload's claim on a receiving slot (waiting for one, or holding one)."""

    client_id: str
    upload_id: str
    task_id: str
    revoked: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    has_slot: bool = False

    def revoke(self, reason: str) -> None:
        if not self.revoked.is_set():
            self.reason = reason
            self.revoked.set()


class UploadSlots:
    """`count` receiving slots, at most one per client (make it on the event loop)."""

    def __init__(self, count: int) -> None:
        self._free = asyncio.Semaphore(count)
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
        return self._free.locked()

    async def acquire(self, hold: SlotHold) -> None:
        """Take a free slot for `hold`, waiting if none is; returns early (without one)
        if the hold is revoked meanwhile."""
        if hold.revoked.is_set():
            return
        if not self._free.locked():  # a free slot: taken without yielding to the loop
            await self._free.acquire()
            hold.has_slot = True
            return
        take = asyncio.ensure_future(self._free.acquire())
        revoked = asyncio.ensure_future(hold.revoked.wait())
        try:
            await asyncio.wait((take, revoked), return_when=asyncio.FIRST_COMPLETED)
        finally:
            revoked.cancel()
            if take.done() and not take.cancelled():
                hold.has_slot = True
            else:
                take.cancel()
        if hold.has_slot and hold.revoked.is_set():
            self._give_back(hold)

    def release(self, hold: SlotHold) -> None:
        """The upload ended (for any reason): its slot, if it had one, is free again."""
        self._give_back(hold)
        if self._holds.get(hold.client_id) is hold:
            del self._holds[hold.client_id]

    def _give_back(self, hold: SlotHold) -> None:
        if hold.has_slot:
            hold.has_slot = False
            self._free.release()

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
