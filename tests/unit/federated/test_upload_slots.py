"""The receiving-slot table: one slot per client at most, and every hold given back when
its client is superseded, dropped, refused or its round closes."""

from __future__ import annotations

import asyncio

from sporenet.federated.server.upload_slots import UploadSlots


def test_one_slot_per_client_and_revoked_holds_give_it_back() -> None:
    async def scenario() -> None:
        slots = UploadSlots(1)
        first = slots.claim("trickler", "u1", "r1-fit")
        await slots.acquire(first)
        assert first.has_slot and slots.busy
        # The same client's next upload (another id) revokes the first at once, even
        # before it has a slot itself.
        second = slots.claim("trickler", "u2", "r1-fit")
        assert first.revoked.is_set() and "superseded" in first.reason
        honest = slots.claim("honest", "h1", "r1-fit")
        waiting = asyncio.ensure_future(slots.acquire(honest))
        await asyncio.sleep(0)
        slots.release(first)  # the revoked stream ends: its slot goes to the queue
        await asyncio.wait_for(waiting, 5)
        assert honest.has_slot and not second.has_slot
        # A client dropped or refused while it waits leaves the queue without a slot.
        pending = asyncio.ensure_future(slots.acquire(second))
        await asyncio.sleep(0)
        slots.revoke("trickler", "dropped")
        await asyncio.wait_for(pending, 5)
        assert not second.has_slot and second.reason == "dropped"
        slots.release(second)
        # The round closes: holds of its task are revoked, holds of others stay.
        slots.revoke_unwanted(lambda cid, task: task != "r1-fit", "the round closed")
        assert honest.revoked.is_set() and honest.reason == "the round closed"
        slots.release(honest)
        assert not slots.busy

    asyncio.run(scenario())
