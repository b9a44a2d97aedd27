"""The open phase's participant statuses: counts and `waiting` follow every change."""

from __future__ import annotations

from sporenet.federated.server.participants import Participants
from sporenet.federated.server.phases import Participant


def test_counts_and_waiting_follow_each_status_change() -> None:
    clients = Participants()
    clients.start_phase(["a", "b", "c"])
    assert clients.count(Participant.SELECTED) == 3 and clients.waiting()
    clients.set("a", Participant.ACCEPTED)
    clients.set("b", Participant.DROPPED)
    clients.set("b", Participant.DROPPED)  # the same status again counts once
    assert clients.count(Participant.SELECTED) == 1
    assert clients.count(Participant.ACCEPTED) == 1
    assert clients.count(Participant.DROPPED) == 1
    clients.set("c", Participant.ACCEPTED)
    assert not clients.waiting()
    assert clients.count(Participant.ACCEPTED) == 2
    clients.set("d", Participant.SELECTED)  # one more, selected mid-phase
    assert clients.waiting() and clients.counts() == {"accepted": 2, "dropped": 1, "selected": 1}


def test_a_restored_phase_counts_what_the_store_saved() -> None:
    clients = Participants()
    clients.restore_phase({"a": "accepted", "b": "selected", "c": "accepted"})
    assert clients.count(Participant.ACCEPTED) == 2 and clients.waiting()
    clients.end_phase()
    assert clients.count(Participant.ACCEPTED) == 0 and not clients.waiting()
