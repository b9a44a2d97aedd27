"""The pool of payload buffers (server receive slots, client models and updates): reuse,
its bound, clearing, and never reusing a buffer still viewed. (That a
reused buffer never corrupts an aggregate is checked end to end: the FedAvg integration
tests compare multi-round results with a direct NumPy computation.)"""

from __future__ import annotations

import numpy as np

from sporenet.federated.common.buffers import BufferPool


def test_a_given_back_buffer_is_reused_for_a_same_or_slightly_smaller_upload() -> None:
    pool = BufferPool(limit=2)
    first = pool.take(1000)
    first[:3] = b"abc"
    owner = first.obj
    pool.give(first)
    again = pool.take(900)
    assert again.obj is owner and len(again) == 900
    assert bytes(again[:3]) == b"abc"  # contents are not cleared: every byte is received
    other = pool.take(400)  # the pooled buffer is taken; less than half its size would not fit
    assert other.obj is not owner and len(other) == 400


def test_a_buffer_more_than_twice_the_size_is_not_used() -> None:
    pool = BufferPool(limit=2)
    big = pool.take(10_000)
    owner = big.obj
    pool.give(big)
    small = pool.take(1000)
    assert small.obj is not owner
    assert pool.take(6000).obj is owner


def test_at_most_limit_idle_buffers_are_kept_and_clear_frees_them() -> None:
    pool = BufferPool(limit=2)
    views = [pool.take(100) for _ in range(3)]
    owners = [v.obj for v in views]
    for v in views:
        pool.give(v)
    kept = {id(pool.take(100).obj) for _ in range(2)}
    assert kept == {id(owners[1]), id(owners[2])}  # the oldest was dropped
    pool.give(pool.take(100))
    pool.clear()
    assert all(pool.take(100).obj is not o for o in owners)


def test_a_buffer_still_viewed_is_left_to_its_views() -> None:
    pool = BufferPool(limit=2)
    values = np.arange(10, dtype=np.float32)
    for keep in (lambda v: v[:40], lambda v: np.frombuffer(v[:40], np.float32)):
        view = pool.take(100)
        view[:40] = values.tobytes()
        owner, kept = view.obj, keep(view)
        pool.give(view)
        fresh = pool.take(100)
        assert fresh.obj is not owner
        fresh[:] = b"\xff" * 100
        np.testing.assert_array_equal(np.frombuffer(kept, np.float32), values)
        del kept
    # Once no view is left, a given-back buffer is reused again.
    view = pool.take(100)
    owner = view.obj
    pool.give(view)
    assert pool.take(100).obj is owner


def test_a_buffer_taken_before_a_clear_is_not_kept_after_it() -> None:
    """An upload folded while its phase closes must not park its buffer in the pool
    through aggregation and publishing."""
    pool = BufferPool(limit=2)
    early, late = pool.take(1000), pool.take(1000)
    early_owner, late_owner = early.obj, late.obj
    pool.clear()  # the phase closes while both are still being received
    pool.give(early)
    after = pool.take(1000)  # taken after the clear: it may be kept
    after_owner = after.obj
    assert after_owner is not early_owner
    pool.give(late)
    pool.give(after)
    assert pool.take(1000).obj is after_owner
    fresh = pool.take(1000).obj
    assert fresh is not early_owner and fresh is not late_owner
