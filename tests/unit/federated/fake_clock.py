"""A clock the test moves by hand, for the state machines that take `clock=`."""

from __future__ import annotations


class FakeClock:
    """Seconds since the epoch, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
