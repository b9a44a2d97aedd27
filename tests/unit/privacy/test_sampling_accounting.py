"""The accountant charges the sampling the server does, checked against Google's
dp-accounting (the test extra): cohorts are fixed-size samples without replacement
(random.sample in the round loop), accounted under replace-one adjacency, where replacing
one client's clipped update moves the sum by up to 2C, so dp-accounting's Gaussian of
sensitivity 1 gets noise multiplier z/2."""

from __future__ import annotations

import logging

import pytest

from sporenet.federated.privacy import RDPAccountant
from sporenet.federated.privacy.config import DPConfig
from sporenet.federated.server.ledger import PrivacyLedger

dpa = pytest.importorskip("dp_accounting", reason="dp-accounting is a test extra")
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402

DELTA = 1e-5


def _theirs_without_replacement(n: int, m: int, z: float, rounds: int) -> float:
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )
    gaussian = dpa.GaussianDpEvent(z / 2)  # sensitivity 2C in units of C
    event = dpa.SampledWithoutReplacementDpEvent(n, m, gaussian)
    accountant.compose(dpa.SelfComposedDpEvent(event, rounds))
    return float(accountant.get_epsilon(DELTA))


@pytest.fixture(autouse=True)
def _quiet_dp_accounting():
    # dp-accounting warns (absl) about fractional orders it skips; it still answers.
    logging.getLogger("absl").setLevel(logging.ERROR)


@pytest.mark.parametrize(
    ("n", "m", "z", "rounds"),
    [(100, 10, 1.0, 100), (100, 10, 2.0, 100), (1000, 20, 1.0, 50), (10_000, 100, 1.2, 1000)],
)
def test_server_ledger_charges_sampling_without_replacement(n, m, z, rounds) -> None:
    """The ledger the server uses charges at least what dp-accounting computes for fixed-
    size sampling without replacement (its bound is tighter at high orders), and close to
    it. 100 clients, 10 a round, z = 1, 100 rounds: 83.9 (Poisson charged 7.90)."""
    dp = DPConfig(mode="central", noise_multiplier=z, clipping_norm=1.0, delta=DELTA)
    ledger = PrivacyLedger(dp, None, resumed_round=None)
    for r in range(rounds):
        ours = ledger.spend(r, sample_rate=m / n, cohort=m, clipping_norm=None)
    theirs = _theirs_without_replacement(n, m, z, rounds)
    assert ours is not None and theirs * (1 - 1e-9) <= ours <= 1.25 * theirs, (ours, theirs)


@pytest.mark.parametrize("z", [1.0, 4.0])
def test_full_cohorts_charge_the_replace_one_gaussian(z) -> None:
    """q = 1 (every live client, or local DP): the Gaussian under replace-one, which
    dp-accounting's PLD accountant treats as twice the sensitivity on its own."""
    acc = RDPAccountant(delta=DELTA)
    ours = acc.spend(noise_multiplier=z, sample_rate=1.0, rounds=10)
    # A coarser grid than the default 1e-4 (faster) only rounds the PLD epsilon up.
    pld = pld_privacy_accountant.PLDAccountant(
        dpa.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3
    )
    pld.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 10))
    exact = float(pld.get_epsilon(DELTA))
    # RDP's conversion is an upper bound of the exact (PLD) epsilon, and not far above it.
    assert exact <= ours <= 1.35 * exact, (ours, exact)


def test_poisson_sampling_stays_accounted_as_dp_accounting_does() -> None:
    """On the same (integer: dp-accounting skips fractional ones it cannot converge on)
    orders, the Poisson accountant gives dp-accounting's epsilon."""
    orders = [o for o in rdp_privacy_accountant.DEFAULT_RDP_ORDERS if float(o).is_integer()]
    acc = RDPAccountant(delta=DELTA, sampling="poisson", orders=tuple(orders))
    ours = acc.spend(noise_multiplier=1.0, sample_rate=0.1, rounds=100)
    theirs = rdp_privacy_accountant.RdpAccountant(orders)
    theirs.compose(
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0)), 100)
    )
    assert ours == pytest.approx(theirs.get_epsilon(DELTA), rel=1e-6)


def test_a_state_saved_before_sampling_was_recorded_is_recharged() -> None:
    """An accountant saved without `sampling` charged Poisson sampling for cohorts drawn
    without replacement: on load its rounds are charged as they were drawn."""
    old = RDPAccountant(delta=DELTA, sampling="poisson")
    old.spend(noise_multiplier=1.0, sample_rate=0.1, rounds=100)
    saved = old.to_dict()
    del saved["sampling"]
    back = RDPAccountant.from_dict(saved)
    assert back.sampling == "without_replacement" and back.rounds == 100
    assert back.epsilon() == pytest.approx(_theirs_without_replacement(100, 10, 1.0, 100))
