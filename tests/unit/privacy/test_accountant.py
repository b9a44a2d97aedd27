"""The RDP accountant against published values and a direct numerical integration."""

import math

import numpy as np
import pytest

from sporenet.federated.privacy import (
    PrivacyBudgetExhaustedError,
    PrivacyConfigError,
    RDPAccountant,
    rdp_sampled_gaussian,
)
from sporenet.federated.privacy.accountant import (
    _log_binomial_expansion,
    _log_integral,
    epsilon_from_rdp,
)

# Published values: tensorflow_privacy's rdp_accountant_test.py (Mironov et al.'s
# implementation), which compares them with multi-precision integration.
TF_ORDERS = (
    1.25,
    1.5,
    1.75,
    2.0,
    2.5,
    3.0,
    4.0,
    5.0,
    6.0,
    7.0,
    8.0,
    10.0,
    12.0,
    14.0,
    16.0,
    20.0,
    24.0,
    28.0,
    32.0,
    64.0,
    256.0,
)


def test_rdp_matches_published_values_at_integer_and_fractional_orders() -> None:
    assert 10 * rdp_sampled_gaussian(0.1, 2.0, 5) == pytest.approx(0.07737, abs=5e-6)
    got = [50 * rdp_sampled_gaussian(0.01, 2.5, a) for a in (1.5, 2.5, 5, 50, 100)]
    want = [0.00065, 0.001085, 0.00218075, 0.023846, 167.416307]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_epsilon_matches_published_values_with_the_classic_conversion() -> None:
    orders = tuple(float(o) for o in range(2, 33))
    rdp = np.array([10_000 * rdp_sampled_gaussian(0.01, 4.0, a) for a in orders])
    eps, order = epsilon_from_rdp(orders, rdp, 1e-5, "classic")
    assert eps == pytest.approx(1.258575, abs=1e-5) and order == 20
    # The improved conversion (Balle et al. 2020) is never worse.
    assert epsilon_from_rdp(orders, rdp, 1e-5, "improved")[0] < eps

    rdp = np.array(
        [
            10_000 * rdp_sampled_gaussian(0.01, 4.0, a) + 100 * rdp_sampled_gaussian(0.1, 2.0, a)
            for a in TF_ORDERS
        ]
    )
    eps, order = epsilon_from_rdp(TF_ORDERS, rdp, 1e-5, "classic")
    assert eps == pytest.approx(3.276237, abs=1e-5) and order == 8


@pytest.mark.parametrize(
    ("q", "sigma", "alpha"),
    [(0.1, 2.0, 5), (0.01, 2.5, 50), (0.5, 1.0, 10), (0.01, 0.5, 30), (0.001, 1.1, 64)],
)
def test_closed_form_equals_direct_numerical_integration(q, sigma, alpha) -> None:
    np.testing.assert_allclose(
        _log_integral(q, sigma, alpha),
        _log_binomial_expansion(q, sigma, alpha),
        rtol=1e-7,
        atol=1e-12,
    )


def test_limits_no_sampling_and_no_data() -> None:
    # q = 1 is the plain Gaussian mechanism: RDP = α / (2σ²).
    assert rdp_sampled_gaussian(1.0, 10.0, 20) == pytest.approx(0.1)
    assert rdp_sampled_gaussian(0.0, 10.0, 20) == 0.0
    # Subsampling only helps, and more noise only helps.
    assert rdp_sampled_gaussian(0.1, 1.0, 8) < rdp_sampled_gaussian(1.0, 1.0, 8)
    assert rdp_sampled_gaussian(0.1, 2.0, 8) < rdp_sampled_gaussian(0.1, 1.0, 8)


def test_accountant_composes_rounds_and_persists() -> None:
    acc = RDPAccountant(delta=1e-5)
    eps1 = acc.spend(noise_multiplier=1.1, sample_rate=0.01)
    eps100 = acc.spend(noise_multiplier=1.1, sample_rate=0.01, rounds=99)
    assert 0 < eps1 < eps100 and acc.rounds == 100 and acc.history == [(0.01, 1.1, 100)]
    one_shot = RDPAccountant(delta=1e-5)
    assert one_shot.spend(noise_multiplier=1.1, sample_rate=0.01, rounds=100) == pytest.approx(
        eps100
    )
    back = RDPAccountant.from_dict(acc.to_dict())
    assert back.epsilon() == pytest.approx(acc.epsilon()) and back.rounds == 100
    assert acc.epsilon(delta=1e-3) < acc.epsilon()


def test_budget_stops_before_overspending() -> None:
    acc = RDPAccountant(delta=1e-5, epsilon_budget=1.0)
    spent = 0
    while acc.can_spend(noise_multiplier=5.0, sample_rate=0.05):
        acc.spend(noise_multiplier=5.0, sample_rate=0.05)
        spent += 1
    assert spent > 10 and acc.epsilon() <= 1.0
    before = acc.to_dict()
    with pytest.raises(PrivacyBudgetExhaustedError, match=r"over the budget 1\.0"):
        acc.spend(noise_multiplier=5.0, sample_rate=0.05)
    assert acc.to_dict() == before  # the refused round was not recorded
    assert acc.epsilon_after(noise_multiplier=5.0, sample_rate=0.05) > 1.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"delta": 0.0}, "`delta`"),
        ({"delta": 1e-5, "epsilon_budget": -1}, "`epsilon_budget`"),
        ({"delta": 1e-5, "conversion": "other"}, "`conversion`"),
        ({"delta": 1e-5, "orders": (1.0,)}, "`orders`"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs, name) -> None:
    with pytest.raises(PrivacyConfigError, match=name):
        RDPAccountant(**kwargs)


def test_bad_steps_and_states_are_refused() -> None:
    acc = RDPAccountant(delta=1e-5)
    with pytest.raises(PrivacyConfigError, match="`noise_multiplier`"):
        acc.spend(noise_multiplier=0.0, sample_rate=0.1)
    with pytest.raises(PrivacyConfigError, match="`sample_rate`"):
        acc.spend(noise_multiplier=1.0, sample_rate=1.5)
    with pytest.raises(PrivacyConfigError, match="malformed"):
        RDPAccountant.from_dict({"delta": 1e-5})
    assert math.isfinite(acc.epsilon())
