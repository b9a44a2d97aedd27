"""The client's outage reports: one event with the cause, then a summary per period."""

from __future__ import annotations

from typing import Any

from sporenet.federated.client.reachability import Reachability


def test_an_outage_is_reported_once_then_summarised() -> None:
    now = [0.0]
    events: list[tuple[str, dict[str, Any]]] = []
    changes: list[str] = []
    link = Reachability(
        "srv:1",
        report=lambda event, level, text, fields: events.append((event, fields)),
        summary_every=30.0,
        clock=lambda: now[0],
        wall_clock=lambda: 1000.0 + now[0],
        on_change=lambda status: changes.append(status["state"]),
    )
    for _ in range(100):  # 100 failures 0.5 s apart: 50 s
        link.failed("srv:1", "UNAVAILABLE", "connection refused", retry_in=0.5)
        now[0] += 0.5
    names = [e for e, _ in events]
    assert names == ["server_unreachable", "server_still_unreachable"], names
    assert events[0][1]["error"] == "UNAVAILABLE: connection refused"
    assert events[0][1]["attempts"] == 2  # a single failed call is not an outage yet
    assert events[1][1]["attempts"] == 62
    assert link.status()["unreachable_since"] == 1000.0 and link.status()["attempts"] == 100
    link.reached("srv:1")
    link.reached("srv:1")
    assert [e for e, _ in events][-1] == "server_reachable"
    assert link.status() == {
        "state": "connected",
        "address": "srv:1",
        "error": "",
        "unreachable_since": None,
        "attempts": 0,
        "retry_in": 0.0,
    }
    assert changes == ["unreachable", "connected"]
    # One failed call, then an answer: nothing reported.
    link.failed("srv:1", "UNAVAILABLE", "connection reset", retry_in=0.1)
    link.reached("srv:1")
    assert [e for e, _ in events][-1] == "server_reachable" and len(events) == 3
