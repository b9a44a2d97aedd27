"""Reed-Solomon decoding of Shamir shares: up to (s - t) // 2 bad shares are located
exactly and the secret recovered; beyond that a row is reported undecodable, never wrong."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.secagg import decoding, shamir
from sporenet.federated.secagg.errors import ReconstructionError


def _secrets(m: int) -> np.ndarray:
    return np.frombuffer(os.urandom(32 * m), np.uint8).reshape(m, 32)


@st.composite
def _case(draw, *, beyond: bool = False):
    """(xs, ys, t, bad mask, secrets): m secrets, s shares each, some of them corrupted."""
    s = draw(st.integers(1, 24), label="shares")
    t = draw(st.integers(1, s), label="threshold")
    m = draw(st.integers(1, 4), label="secrets")
    e = decoding.correctable(s, t)
    low, high = (e + 1, s) if beyond else (0, e)
    count = draw(st.integers(low, high), label="bad")
    xs_row = np.array(
        draw(st.lists(st.integers(1, shamir.PRIME - 1), min_size=s, max_size=s, unique=True))
    )
    secrets = _secrets(m)
    ys = shamir.share(secrets, xs_row, t)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    bad = np.zeros((m, s), bool)
    for row in range(m):
        picked = rng.choice(s, size=count, replace=False)
        bad[row, picked] = True
        for j in picked:
            # A bad share differs in at least one chunk, by a non-zero amount, and may
            # even be outside the field (the wire carries uint32).
            chunks = rng.choice(
                shamir.CHUNKS, size=rng.integers(1, shamir.CHUNKS + 1), replace=False
            )
            if rng.random() < 0.2:
                ys[row, j, chunks[0]] = shamir.PRIME + rng.integers(0, 2**32 - shamir.PRIME)
                chunks = chunks[1:]
            ys[row, j, chunks] = (
                ys[row, j, chunks] + rng.integers(1, shamir.PRIME, chunks.size)
            ) % shamir.PRIME
    return np.tile(xs_row, (m, 1)), ys, t, bad, secrets


@settings(max_examples=80, deadline=None)
@given(case=_case())
def test_up_to_the_correctable_number_of_bad_shares_are_located_exactly(case) -> None:
    xs, ys, t, bad, secrets = case
    got = decoding.decode(xs, ys, t)
    assert got.ok.all()
    np.testing.assert_array_equal(got.bad, bad)
    np.testing.assert_array_equal(got.secrets, secrets)


@settings(max_examples=60, deadline=None)
@given(case=_case(beyond=True))
def test_beyond_the_correctable_number_a_row_is_undecodable_not_wrong(case) -> None:
    xs, ys, t, _, secrets = case
    got = decoding.decode(xs, ys, t)
    s = xs.shape[1]
    for row in range(xs.shape[0]):
        if got.ok[row]:
            # Decodable only if the shares left still pin the secret (s == t leaves no
            # redundancy to detect anything: the caller's commitment check is what remains).
            if s > t:
                np.testing.assert_array_equal(got.secrets[row], secrets[row])
        else:
            assert not got.bad[row].any()


def test_shares_with_different_holders_per_row_in_one_call() -> None:
    rng = np.random.default_rng(5)
    m, s, t = 30, 12, 6
    secrets = _secrets(m)
    xs = np.stack([rng.choice(np.arange(1, 500), size=s, replace=False) for _ in range(m)])
    ys = np.stack([shamir.share(secrets[i : i + 1], xs[i], t)[0] for i in range(m)])
    bad = np.zeros((m, s), bool)
    for i in range(0, m, 3):
        j = rng.choice(s, size=i % 4, replace=False)
        bad[i, j] = True
        ys[i, j, 0] = (ys[i, j, 0] + 1) % shamir.PRIME
    got = decoding.decode(xs, ys, t)
    assert got.ok.all() and got.correctable == 3
    np.testing.assert_array_equal(got.bad, bad)
    np.testing.assert_array_equal(got.secrets, secrets)


def test_one_more_share_than_threshold_detects_but_cannot_correct() -> None:
    secrets = _secrets(2)
    xs = np.arange(1, 6)
    ys = shamir.share(secrets, xs, 4)
    ys[1, 2, 3] = (ys[1, 2, 3] + 7) % shamir.PRIME
    got = decoding.decode(np.tile(xs, (2, 1)), ys, 4)
    assert got.correctable == 0
    assert got.ok.tolist() == [True, False]
    np.testing.assert_array_equal(got.secrets[0], secrets[0])


def test_bad_shapes_and_too_few_shares_are_refused() -> None:
    ys = shamir.share(_secrets(1), np.arange(1, 4), 2)
    with pytest.raises(ReconstructionError, match="need 3 shares"):
        decoding.decode(np.arange(1, 3)[None], ys[:, :2], 3)
    with pytest.raises(ReconstructionError, match="expected xs"):
        decoding.decode(np.arange(1, 4), ys, 2)
    with pytest.raises(ReconstructionError, match="same holder"):
        decoding.decode(np.array([[1, 1, 2]]), ys, 2)
