"""A single masked upload is statistically indistinguishable from uniform over the ring."""

import math

import numpy as np
import pytest

from sporenet.federated.secagg import SecAggClient, SecAggConfig, SecAggServer

# One-sided standard normal quantile for p = 1e-6: the test is a fixed-seed input with
# OS-random masks, so it fails spuriously about once in a million runs.
Z_1E6 = 4.753


def _chi2_critical(dof: int, z: float = Z_1E6) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (accurate to <1% here)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def _one_masked_upload(update: np.ndarray, modulus_bits: int) -> np.ndarray:
    n = 3
    server = SecAggServer.start(
        SecAggConfig(modulus_bits=modulus_bits), num_clients=n, vector_length=update.size
    )
    clients = [SecAggClient(server.setup_for(i)) for i in range(n)]
    for c in clients:
        server.receive(c.advertise_keys())
    server.close_stage()
    for c in clients:
        server.receive(c.share_keys(server.message_for(c.index)))
    server.close_stage()
    return clients[0].masked_input(server.message_for(0), update).vector


@pytest.mark.parametrize("modulus_bits", [32, 20])
def test_masked_upload_of_a_constant_update_is_uniform(modulus_bits: int) -> None:
    # A constant update encodes to one ring value: unmasked, every bucket but one is empty.
    y = _one_masked_upload(np.full(1 << 16, 0.7), modulus_bits).astype(np.int64)
    buckets = 256
    for name, b in (("high bits", y >> (modulus_bits - 8)), ("low bits", y & 0xFF)):
        counts = np.bincount(b, minlength=buckets)
        assert counts.size == buckets
        expected = y.size / buckets
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < _chi2_critical(buckets - 1), f"{name}: chi2={chi2:.1f}"
    assert y.max() < 2**modulus_bits


def test_the_chi_square_test_catches_a_non_uniform_vector() -> None:
    # Guard against a vacuous threshold: a slightly biased source must fail it.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2**32, size=1 << 16, dtype=np.int64)
    y[: 1 << 12] = 0  # 6% of the values stuck at zero
    counts = np.bincount(y >> 24, minlength=256)
    expected = y.size / 256
    assert float(((counts - expected) ** 2 / expected).sum()) > _chi2_critical(255)
