"""Rényi DP accountant for the subsampled Gaussian mechanism of a federated round.

Each round releases a sum of clipped updates (norm <= C) plus N(0, (zC)^2) noise, over a
cohort sampled from the live clients. Two samplings are accounted:

- "without_replacement" (the server's: a cohort of m of the n live clients, uniformly,
  rate gamma = m/n), under replace-one adjacency: replacing one client's data moves the
  sum by up to 2C, so the base Gaussian's RDP is eps(j) = j (2C)^2 / (2 (zC)^2) = 2j/z^2.
  Integer orders use the general upper bound of Wang, Balle and Kasiviswanathan 2019
  (Theorem 9, with eps(inf) = inf):
  A = 1 + gamma^2 C(a,2) min(4(e^eps(2) - 1), 2 e^eps(2))
        + sum_{j>=3} 2 gamma^j C(a,j) e^((j-1) eps(j)),
  RDP = log(A)/(a-1); other orders interpolate (a-1)·RDP linearly between the integers
  around them, which bounds it because (a-1)·RDP is convex in a.
- "poisson" (each client independently with probability q), under add/remove-one
  adjacency: its RDP at order a is log(A_a)/(a-1) with A_a = E_{x~mu0}[(mu(x)/mu0(x))^a],
  mu0 = N(0, z^2), mu = (1-q)mu0 + qN(1, z^2) (Mironov, Talwar, Zhang 2019). Integer
  orders use the exact binomial expansion; other orders integrate the definition
  numerically (log-space trapezoid on a fine grid).

RDP adds over rounds; epsilon for a delta is the minimum over orders of the conversion of
Balle et al. 2020 ("improved"), or the classic rdp + log(1/delta)/(a-1) ("classic").

The accountant is a plain record of what was spent (to_dict/from_dict, JSON-safe) so the
server persists it with the round state, and it refuses a round that would overspend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from sporenet.federated.privacy.errors import PrivacyBudgetExhaustedError, PrivacyConfigError

DEFAULT_ORDERS: tuple[float, ...] = (
    1.25,
    1.5,
    1.75,
    2.0,
    2.25,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    *map(float, range(5, 64)),
    64.0,
    80.0,
    96.0,
    128.0,
    192.0,
    256.0,
)
CONVERSIONS = ("improved", "classic")
SAMPLINGS = ("without_replacement", "poisson")


def _log_binomial_expansion(q: float, sigma: float, alpha: int) -> float:
    k = np.arange(alpha + 1, dtype=np.float64)
    log_binom = (
        math.lgamma(alpha + 1)
        - np.array([math.lgamma(i + 1) for i in k])
        - np.array([math.lgamma(alpha - i + 1) for i in k])
    )
    terms = (
        log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + (k * k - k) / (2 * sigma**2)
    )
    top = terms.max()
    return float(top + math.log(np.exp(terms - top).sum()))


def _log_integral(q: float, sigma: float, alpha: float) -> float:
    # log[(1-q) + q·exp((2x-1)/(2σ²))] grows like α·x/σ² for large x, so the integrand
    # peaks near x ≈ qα-ish..α; the grid spans both tails by 40σ.
    lo, hi = -40.0 * sigma - 1.0, alpha + 40.0 * sigma + 1.0
    x = np.linspace(lo, hi, 200_001)
    log_mu0 = -x * x / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi))
    log_ratio = np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * sigma**2))
    f = log_mu0 + alpha * log_ratio
    top = f.max()
    w = np.exp(f - top)
    dx = x[1] - x[0]
    return float(top + math.log(dx * (w.sum() - 0.5 * (w[0] + w[-1]))))


def rdp_sampled_gaussian(q: float, noise_multiplier: float, order: float) -> float:
    """RDP at `order` of one release of the q-subsampled Gaussian with std z (sensitivity 1)."""
    if q == 0.0:
        return 0.0
    if q == 1.0:
        return order / (2 * noise_multiplier**2)
    if math.isinf(order):
        return math.inf
    if float(order).is_integer():
        log_a = _log_binomial_expansion(q, noise_multiplier, int(order))
    else:
        log_a = _log_integral(q, noise_multiplier, order)
    return max(log_a, 0.0) / (order - 1)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _log_a_without_replacement(gamma: float, noise_multiplier: float, order: int) -> float:
    """log A of the general bound (module docstring) at an integer order >= 2."""

    def eps(j: int) -> float:  # the base Gaussian's RDP; replace-one moves the sum by 2C
        return 2.0 * j / noise_multiplier**2

    second = min(math.log(4.0) + math.log(math.expm1(eps(2))), math.log(2.0) + eps(2))
    terms = [0.0, 2 * math.log(gamma) + _log_comb(order, 2) + second]
    terms += [
        math.log(2.0) + j * math.log(gamma) + _log_comb(order, j) + (j - 1) * eps(j)
        for j in range(3, order + 1)
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def rdp_without_replacement(gamma: float, noise_multiplier: float, order: float) -> float:
    """RDP at `order` of one release of the Gaussian with std z·C on a uniform fixed-size
    sample of a gamma share of the clients, under replace-one adjacency."""
    if gamma == 0.0:
        return 0.0
    if math.isinf(order):
        return math.inf
    if gamma == 1.0:
        return 2.0 * order / noise_multiplier**2
    lo, hi = max(math.floor(order), 1), max(math.ceil(order), 2)

    def scaled(a: int) -> float:  # (a - 1)·RDP(a), 0 at a = 1
        return 0.0 if a == 1 else _log_a_without_replacement(gamma, noise_multiplier, a)

    if lo == hi:
        return scaled(lo) / (order - 1)
    t = (order - lo) / (hi - lo)
    return ((1 - t) * scaled(lo) + t * scaled(hi)) / (order - 1)


_RDP = {"poisson": rdp_sampled_gaussian, "without_replacement": rdp_without_replacement}


@lru_cache(maxsize=64)
def _rdp_curve(
    q: float, noise_multiplier: float, orders: tuple[float, ...], sampling: str
) -> np.ndarray:
    # Rounds usually repeat one (q, z): the numerical integrals are computed once.
    rdp = _RDP[sampling]
    curve = np.array([rdp(q, noise_multiplier, a) for a in orders])
    curve.setflags(write=False)
    return curve


def epsilon_from_rdp(
    orders: tuple[float, ...], rdp: np.ndarray, delta: float, conversion: str = "improved"
) -> tuple[float, float]:
    """(epsilon, best order) for `delta` from RDP values at `orders`."""
    a = np.asarray(orders, np.float64)
    r = np.asarray(rdp, np.float64)
    if conversion == "classic":
        eps = r + math.log(1 / delta) / (a - 1)
    else:  # Balle, Barthe, Gaboardi, Hsu, Sato 2020, Theorem 21
        eps = r + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)
    eps = np.where(np.isnan(eps), np.inf, eps)
    i = int(np.argmin(eps))
    return max(float(eps[i]), 0.0), float(a[i])


@dataclass
class RDPAccountant:
    """Tracks privacy spent over rounds; optionally enforces an (epsilon, delta) budget.

    `sampling` names how the cohorts are drawn (module docstring): the server's fixed-size
    samples without replacement by default; `sample_rate` is then the cohort's share m/n.
    """

    delta: float
    epsilon_budget: float | None = None
    orders: tuple[float, ...] = DEFAULT_ORDERS
    conversion: str = "improved"
    sampling: str = "without_replacement"

    def __post_init__(self) -> None:
        if not (isinstance(self.delta, float) and 0.0 < self.delta < 1.0):
            raise PrivacyConfigError(f"`delta` must be a float in (0, 1), found {self.delta!r}")
        if self.epsilon_budget is not None and not (
            isinstance(self.epsilon_budget, int | float) and self.epsilon_budget > 0
        ):
            raise PrivacyConfigError(
                f"`epsilon_budget` must be a number > 0 or None, found {self.epsilon_budget!r}"
            )
        if self.conversion not in CONVERSIONS:
            raise PrivacyConfigError(
                f"`conversion` must be one of {list(CONVERSIONS)}, found {self.conversion!r}"
            )
        if self.sampling not in SAMPLINGS:
            raise PrivacyConfigError(
                f"`sampling` must be one of {list(SAMPLINGS)}, found {self.sampling!r}"
            )
        if not self.orders or any(not (o > 1) for o in self.orders):
            raise PrivacyConfigError("`orders` must be a non-empty list of numbers > 1")
        self.orders = tuple(float(o) for o in self.orders)
        self._rdp = np.zeros(len(self.orders))
        #: (sample rate, noise multiplier, rounds) per distinct mechanism, in order.
        self.history: list[tuple[float, float, int]] = []

    @staticmethod
    def _check_step(noise_multiplier: float, sample_rate: float, rounds: int) -> None:
        if not (
            isinstance(noise_multiplier, int | float)
            and noise_multiplier > 0
            and math.isfinite(noise_multiplier)
        ):
            raise PrivacyConfigError(
                f"`noise_multiplier` must be a finite number > 0, found {noise_multiplier!r}"
            )
        if not (isinstance(sample_rate, int | float) and 0.0 <= sample_rate <= 1.0):
            raise PrivacyConfigError(f"`sample_rate` must be in [0, 1], found {sample_rate!r}")
        if not isinstance(rounds, int) or rounds < 1:
            raise PrivacyConfigError(f"`rounds` must be an int >= 1, found {rounds!r}")

    def _step_rdp(self, noise_multiplier: float, sample_rate: float, rounds: int) -> np.ndarray:
        curve = _rdp_curve(float(sample_rate), float(noise_multiplier), self.orders, self.sampling)
        return rounds * curve

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far for `delta` (default: the accountant's delta)."""
        if not self.history:  # nothing released; the RDP conversion's slack is not a loss
            return 0.0
        return epsilon_from_rdp(self.orders, self._rdp, delta or self.delta, self.conversion)[0]

    def epsilon_after(
        self, *, noise_multiplier: float, sample_rate: float, rounds: int = 1
    ) -> float:
        """Epsilon if `rounds` more rounds with these settings were spent (nothing is recorded)."""
        self._check_step(noise_multiplier, sample_rate, rounds)
        rdp = self._rdp + self._step_rdp(noise_multiplier, sample_rate, rounds)
        return epsilon_from_rdp(self.orders, rdp, self.delta, self.conversion)[0]

    def spend(self, *, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        """Record rounds of the mechanism and return the new epsilon.

        With a budget, a round that would exceed it is refused *before* it is recorded
        (PrivacyBudgetExhaustedError), so the caller stops without releasing it.
        """
        self._check_step(noise_multiplier, sample_rate, rounds)
        step = self._step_rdp(noise_multiplier, sample_rate, rounds)
        eps = epsilon_from_rdp(self.orders, self._rdp + step, self.delta, self.conversion)[0]
        if self.epsilon_budget is not None and eps > self.epsilon_budget:
            raise PrivacyBudgetExhaustedError(
                f"the next {rounds} round(s) would reach epsilon={eps:.4f} at delta={self.delta}, "
                f"over the budget {self.epsilon_budget}; spent so far: {self.epsilon():.4f}"
            )
        self._rdp += step
        key = (float(sample_rate), float(noise_multiplier))
        if self.history and self.history[-1][:2] == key:
            self.history[-1] = (*key, self.history[-1][2] + rounds)
        else:
            self.history.append((*key, rounds))
        return eps

    def can_spend(self, *, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> bool:
        """Whether `spend` with these settings would stay within the budget."""
        if self.epsilon_budget is None:
            return True
        return (
            self.epsilon_after(
                noise_multiplier=noise_multiplier, sample_rate=sample_rate, rounds=rounds
            )
            <= self.epsilon_budget
        )

    @property
    def rounds(self) -> int:
        return sum(r for _, _, r in self.history)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state; the RDP curve is recomputed from the history on load."""
        return {
            "delta": self.delta,
            "epsilon_budget": self.epsilon_budget,
            "orders": list(self.orders),
            "conversion": self.conversion,
            "sampling": self.sampling,
            "history": [list(h) for h in self.history],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RDPAccountant:
        """The accountant `to_dict` saved. A state without `sampling` (saved before the
        server's sampling was accounted) is recharged as sampling without replacement,
        the sampling its rounds were drawn with."""
        try:
            acc = cls(
                delta=d["delta"],
                epsilon_budget=d["epsilon_budget"],
                orders=tuple(d["orders"]),
                conversion=d["conversion"],
                sampling=d.get("sampling", "without_replacement"),
            )
            for q, z, rounds in d["history"]:
                acc._check_step(z, q, rounds)
                acc._rdp += acc._step_rdp(z, q, rounds)
                acc.history.append((float(q), float(z), int(rounds)))
        except (KeyError, TypeError, ValueError) as e:
            raise PrivacyConfigError(
                f"accountant state is incomplete or malformed: {e!r}"
            ) from None
        return acc
