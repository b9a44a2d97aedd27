"""Vectorized Shamir sharing over GF(2^31 - 1): any t shares reconstruct, fewer cannot."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.secagg import shamir
from sporenet.federated.secagg.errors import ReconstructionError, SecAggConfigError


def _secrets(m: int) -> np.ndarray:
    return np.frombuffer(os.urandom(32 * m), np.uint8).reshape(m, 32)


@settings(max_examples=40, deadline=None)
@given(holders=st.integers(1, 30), data=st.data())
def test_any_threshold_subset_reconstructs_every_secret(holders: int, data) -> None:
    t = data.draw(st.integers(1, holders), label="threshold")
    xs = np.array(
        data.draw(
            st.lists(
                st.integers(1, shamir.PRIME - 1), min_size=holders, max_size=holders, unique=True
            ),
            label="xs",
        )
    )
    secrets = _secrets(3)
    shares = shamir.share(secrets, xs, t)
    assert shares.shape == (3, holders, shamir.CHUNKS)
    assert np.all((shares >= 0) & (shares < shamir.PRIME))
    pick = data.draw(st.permutations(range(holders)), label="order")[:t]
    got = shamir.reconstruct(np.tile(xs[pick], (3, 1)), shares[:, pick, :], t)
    np.testing.assert_array_equal(got, secrets)


def test_many_secrets_with_different_holder_sets_in_one_call() -> None:
    secrets = _secrets(50)
    rng = np.random.default_rng(1)
    t = 5
    xs_rows, ys_rows = [], []
    for i in range(50):
        holders = rng.choice(np.arange(1, 1000), size=9, replace=False)
        shares = shamir.share(secrets[i : i + 1], holders, t)[0]
        keep = rng.choice(9, size=t, replace=False)
        xs_rows.append(holders[keep])
        ys_rows.append(shares[keep])
    got = shamir.reconstruct(np.array(xs_rows), np.array(ys_rows), t)
    np.testing.assert_array_equal(got, secrets)


def test_fewer_than_threshold_shares_is_refused() -> None:
    secrets = _secrets(1)
    xs = np.arange(1, 8)
    shares = shamir.share(secrets, xs, 4)
    with pytest.raises(ReconstructionError, match="need 4 shares"):
        shamir.reconstruct(xs[None, :3], shares[:, :3], 4)


def test_threshold_minus_one_shares_say_nothing_about_the_secret() -> None:
    # With t-1 shares fixed, every candidate secret is consistent with them; concretely,
    # interpolating only t-1 shares lands on a value unrelated to the secret.
    secrets = _secrets(20)
    xs = np.arange(1, 6)
    shares = shamir.share(secrets, xs, 3)
    wrong = shamir.interpolate_at_zero(np.tile(xs[:2], (20, 1)), shares[:, :2])
    right = shamir.interpolate_at_zero(np.tile(xs[:3], (20, 1)), shares[:, :3])
    np.testing.assert_array_equal(right, shamir.secrets_to_field(secrets))
    assert not np.any(np.all(wrong == right, axis=1))


def test_inconsistent_shares_fail_loudly_or_differ() -> None:
    secrets = _secrets(1)
    xs = np.arange(1, 6)
    shares = shamir.share(secrets, xs, 3).copy()
    shares[0, 0, 0] = (shares[0, 0, 0] + 1) % shamir.PRIME
    try:
        got = shamir.reconstruct(xs[None, :3], shares[:, :3], 3)
    except ReconstructionError:
        return
    assert not np.array_equal(got, secrets)


def test_bad_inputs_raise_typed_errors() -> None:
    with pytest.raises(SecAggConfigError, match="threshold"):
        shamir.share(_secrets(1), np.arange(1, 4), 4)
    with pytest.raises(SecAggConfigError, match="distinct"):
        shamir.share(_secrets(1), np.array([1, 1, 2]), 2)
    with pytest.raises(SecAggConfigError, match="distinct"):
        shamir.share(_secrets(1), np.array([0, 1, 2]), 2)
    shares = shamir.share(_secrets(1), np.arange(1, 4), 2)
    with pytest.raises(ReconstructionError, match="same holder"):
        shamir.reconstruct(np.array([[2, 2]]), shares[:, [1, 1]], 2)
    with pytest.raises(ReconstructionError, match="bytes"):
        shamir.share_from_bytes(b"\x00" * 3)


def test_share_bytes_round_trip() -> None:
    shares = shamir.share(_secrets(1), np.arange(1, 4), 2)
    row = shares[0, 1]
    assert len(shamir.share_to_bytes(row)) == shamir.SHARE_BYTES
    np.testing.assert_array_equal(shamir.share_from_bytes(shamir.share_to_bytes(row)), row)
