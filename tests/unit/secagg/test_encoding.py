"""Clipping + stochastic fixed-point encoding: the decoded sum is within the stated error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.secagg import SecAggConfig
from sporenet.federated.secagg.encoding import FixedPointCodec


def _sum_encoded(codec: FixedPointCodec, xs: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    acc = np.zeros(xs.shape[1], codec.dtype)
    for x in xs:
        acc += codec.encode(x, rng)
    return codec.decode_sum(acc)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 300),
    clip=st.floats(1e-3, 1e3),
    modulus_bits=st.sampled_from([16, 24, 32, 40, 64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_decoded_sum_is_within_n_steps_of_the_clipped_sum(n, clip, modulus_bits, seed) -> None:
    params = SecAggConfig(clipping_range=clip, modulus_bits=modulus_bits).resolve(n)
    codec = FixedPointCodec(params)
    rng = np.random.default_rng(seed)
    # Values spread beyond the clipping range on purpose, including the exact bounds.
    xs = rng.uniform(-2 * clip, 2 * clip, size=(n, 17))
    xs[:, 0] = clip
    xs[:, 1] = -clip
    got = _sum_encoded(codec, xs, seed)
    want = np.clip(xs, -clip, clip).sum(axis=0)
    assert np.all(np.abs(got - want) < codec.sum_error_bound(n))


def test_stochastic_rounding_is_unbiased() -> None:
    params = SecAggConfig(clipping_range=1.0, quantization_bits=4, modulus_bits=32).resolve(2)
    codec = FixedPointCodec(params)
    x = np.full(200_000, 0.3 * codec.step)  # a third of a level: deterministic rounding gives 0
    decoded = codec.decode_sum(codec.encode(x, np.random.default_rng(0)))
    # Mean of Bernoulli(0.3)·step over 2e5 draws: standard error 0.001·step; allow 5 sigma.
    assert abs(decoded.mean() - 0.3 * codec.step) < 5e-3 * codec.step


def test_encode_does_not_modify_the_callers_array_and_rejects_nan() -> None:
    codec = FixedPointCodec(SecAggConfig().resolve(4))
    x = np.array([5.0, -5.0, 0.25])
    codec.encode(x, np.random.default_rng(0))
    np.testing.assert_array_equal(x, [5.0, -5.0, 0.25])
    with pytest.raises(Exception, match="NaN"):
        codec.encode(np.array([np.nan]), np.random.default_rng(0))


def test_encoded_values_live_in_the_ring() -> None:
    params = SecAggConfig(modulus_bits=20).resolve(10)
    codec = FixedPointCodec(params)
    y = codec.encode(np.linspace(-1, 1, 1001), np.random.default_rng(0))
    assert y.dtype == np.uint32 and int(y.max()) < 2**20
