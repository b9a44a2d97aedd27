"""The session watchdog: cancels an overdue call, leaves a disarmed one alone, and stops."""

from __future__ import annotations

import threading
import time

from sporenet.federated.session_stream import Watchdog


class FakeCall:
    """Records cancel() like a grpc call would receive it."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


def test_an_overdue_reply_cancels_the_call() -> None:
    dog, call = Watchdog(), FakeCall()
    started = time.monotonic()
    dog.arm(call, 0.2)  # type: ignore[arg-type]
    assert call.cancelled.wait(5)
    assert time.monotonic() - started >= 0.2
    dog.close()


def test_a_disarmed_call_is_left_alone_and_rearming_moves_the_deadline() -> None:
    dog, first, second = Watchdog(), FakeCall(), FakeCall()
    dog.arm(first, 0.2)  # type: ignore[arg-type]
    dog.disarm()
    dog.arm(second, 0.6)  # type: ignore[arg-type]
    assert not second.cancelled.wait(0.4)  # past the first deadline, before the second
    assert second.cancelled.wait(5)
    assert not first.cancelled.is_set()
    dog.close()


def test_close_stops_the_thread_and_a_later_arm_starts_one() -> None:
    dog = Watchdog()
    dog.arm(FakeCall(), 60)  # type: ignore[arg-type]
    thread = dog._thread
    assert thread is not None and thread.is_alive()
    dog.close()
    assert not thread.is_alive()
    call = FakeCall()
    dog.arm(call, 0.05)  # type: ignore[arg-type]
    assert call.cancelled.wait(5)
    dog.close()
