"""The privacy ledger: a job's differential privacy, kept apart from the round logic.

It wraps aggregation the way Flower wraps a strategy with differential privacy: the round
manager asks it for the fit phase's aggregator (the strategy's own, or the clipped noised
mean for central DP), for the `dp_*` keys a client-side mechanism needs, whether the
budget allows the next round, and it charges every released round to the RDP accountant.
Its state (the accountant, the adaptive clipping norm, what each round spent) is saved in
the store with the round it paid for.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from sporenet.federated.aggregation import Aggregator, Template
from sporenet.federated.errors import ConfigError
from sporenet.federated.privacy import CentralDPAggregator, DistributedDP, RDPAccountant
from sporenet.federated.privacy.clipping import AdaptiveClipping
from sporenet.federated.privacy.config import DPConfig
from sporenet.federated.secagg.config import SecAggConfig
from sporenet.federated.strategies.base import Strategy


class PrivacyLedger:
    """What a job's differential privacy has spent and what it may still spend."""

    def __init__(self, dp: DPConfig | None, saved: Any, *, resumed_round: int | None) -> None:
        """Restore the ledger from the store's `saved` state, or start a fresh one.

        Args:
            dp: the job's `[differential_privacy]` settings (None: no DP).
            saved: what `state()` returned when the store last saved it (None if never).
            resumed_round: the round of the job in the state dir, None for a new job.

        Raises:
            ConfigError: DP enabled for a job that started without it (its epsilon
                would not cover the earlier rounds), or a malformed saved state.
        """
        self.dp = dp
        self.accountant: RDPAccountant | None = None
        self.adaptive: AdaptiveClipping | None = None
        self.rounds: list[dict[str, Any]] = []  # what each released round spent
        if dp is None:
            return
        # delta and the budget are the configuration's; what was spent is the store's. The
        # round loop draws each cohort with random.sample: fixed size, without replacement.
        settings: dict[str, Any] = {
            "delta": dp.delta,
            "epsilon_budget": dp.epsilon_budget,
            "sampling": "without_replacement",
        }
        if saved is None:
            if resumed_round is not None:
                raise ConfigError(
                    "`differential_privacy` cannot be enabled for a job that started without"
                    f" it (the state dir is at round {resumed_round}): its epsilon would not"
                    " cover the earlier rounds; start a new state dir"
                )
            self.accountant = RDPAccountant(**settings)
            self.adaptive = dp.adaptive()
            return
        if not isinstance(saved, dict) or not isinstance(saved.get("accountant"), dict):
            raise ConfigError("the state dir's saved privacy state is malformed")
        self.accountant = RDPAccountant.from_dict({**saved["accountant"], **settings})
        restore = dp.adaptive_clipping and saved.get("adaptive")
        self.adaptive = AdaptiveClipping.from_dict(saved["adaptive"]) if restore else dp.adaptive()
        self.rounds = list(saved.get("rounds", []))

    @property
    def enabled(self) -> bool:
        return self.accountant is not None

    def epsilon(self) -> float:
        """Epsilon spent so far (0 without DP)."""
        return self.accountant.epsilon() if self.accountant is not None else 0.0

    def task_config(self, threshold: int = 0) -> dict[str, Any]:
        """What a client must do for client-side DP (the SDK reads these `dp_*` keys)."""
        dp = self.dp
        if dp is None or dp.mode == "central":
            return {}
        if dp.mode == "local":  # the client adds all of the noise
            return {
                "dp_local_noise_multiplier": dp.noise_multiplier,
                "dp_clipping_norm": dp.clipping_norm,
            }
        # distributed: clip and add N(0, (zC)²/t); any t contributors carry (zC)² in sum.
        return {
            "dp_noise_multiplier": dp.noise_multiplier,
            "dp_clipping_norm": dp.clipping_norm,
            "dp_min_clients": threshold,
        }

    def charged_rate(self, sample_rate: float) -> float:
        """The sampling rate the accountant charges: local DP protects each release on its
        own (the server knows who was sampled), so it gets no amplification."""
        return 1.0 if self.dp is not None and self.dp.mode == "local" else sample_rate

    def budget_left(self, sample_rate: float) -> str:
        """Why the job must stop before a fit round at `sample_rate` ("" if it fits)."""
        dp, acc = self.dp, self.accountant
        if dp is None or acc is None or acc.epsilon_budget is None:
            return ""
        if acc.can_spend(noise_multiplier=dp.noise_multiplier, sample_rate=sample_rate):
            return ""
        after = acc.epsilon_after(noise_multiplier=dp.noise_multiplier, sample_rate=sample_rate)
        return (
            f"privacy budget reached after {acc.rounds} round(s): epsilon={acc.epsilon():.4f}"
            f" at delta={acc.delta:g}; one more round would reach {after:.4f}, over"
            f" epsilon_budget={acc.epsilon_budget:g}"
        )

    def make_aggregator(self, strategy: Strategy, template: Template, cohort: int) -> Aggregator:
        """The fit phase's aggregator: the strategy's, or the central-DP clipped noised mean."""
        dp = self.dp
        if dp is None or dp.mode != "central":
            return strategy.make_aggregator(template)
        # Noise comes from the OS, never the job's seed: predictable noise protects nothing.
        return CentralDPAggregator(
            template,
            noise_multiplier=dp.noise_multiplier,
            expected_clients=max(cohort, 1),
            clipping_norm=None if self.adaptive is not None else dp.clipping_norm,
            adaptive=self.adaptive,
        )

    def check_distributed_range(
        self, secure: SecAggConfig | None, min_clients: int, template: Template
    ) -> None:
        """Distributed DP's noised coordinates must fit secagg's clipping range (else the
        clipped noise is no longer Gaussian): checked once the model's size is known."""
        dp = self.dp
        if dp is None or dp.mode != "distributed" or secure is None:
            return
        # The smallest cohort has the smallest threshold, hence the largest noise share.
        t = secure.resolve(min_clients).threshold
        share = DistributedDP(
            noise_multiplier=dp.noise_multiplier, clipping_norm=dp.clipping_norm, min_clients=t
        )
        size = sum(int(np.prod(shape)) for shape, _ in template.values())
        need = share.suggested_clipping_range(size)
        if secure.clipping_range < need:
            raise ConfigError(
                f"`secure_aggregation.clipping_range` must be >= {need:.4g} with distributed DP"
                f" (clipping_norm {dp.clipping_norm:g} plus the tail of each client's noise,"
                f" std {share.client_noise_std:.4g} at threshold {t}, over {size} coordinates),"
                f" got {secure.clipping_range:g}"
            )

    def spend(
        self, round_: int, *, sample_rate: float, cohort: int, clipping_norm: float | None
    ) -> float | None:
        """Charge a released round to the accountant; the epsilon now spent (None: no DP).

        The budget was checked when the round started: a round released is always paid.
        """
        dp, acc = self.dp, self.accountant
        if dp is None or acc is None:
            return None
        budget, acc.epsilon_budget = acc.epsilon_budget, None
        try:
            eps = acc.spend(noise_multiplier=dp.noise_multiplier, sample_rate=sample_rate)
        finally:
            acc.epsilon_budget = budget
        self.rounds.append(
            {
                "round": round_,
                "epsilon": eps,
                "sample_rate": sample_rate,
                "cohort": cohort,
                "noise_multiplier": dp.noise_multiplier,
                "clipping_norm": clipping_norm if clipping_norm is not None else dp.clipping_norm,
            }
        )
        return eps

    def charged(
        self, round_: int, *, sample_rate: float, cohort: int, clipping_norm: float | None
    ) -> PrivacyLedger | None:
        """This ledger as it will be once the round is released (None without DP), this
        one left as it is: `commit` it when the store has recorded the round's model, so
        a publication that fails and is retried is charged once (publication.py)."""
        if not self.enabled:
            return None
        after = copy.copy(self)
        after.accountant = copy.deepcopy(self.accountant)
        after.rounds = list(self.rounds)
        after.spend(round_, sample_rate=sample_rate, cohort=cohort, clipping_norm=clipping_norm)
        return after

    def commit(self, after: PrivacyLedger) -> None:
        """Take the charge `charged` worked out (the round is now published)."""
        self.accountant, self.rounds = after.accountant, after.rounds

    def state(self) -> dict[str, Any]:
        """What the store keeps about privacy (JSON); `status` shows it."""
        acc = self.accountant
        if acc is None:  # a job without differential privacy has nothing to report
            return {}
        return {
            "mode": self.dp.mode if self.dp is not None else "",
            "epsilon": acc.epsilon(),
            "delta": acc.delta,
            "epsilon_budget": acc.epsilon_budget,
            "rounds": self.rounds,
            "accountant": acc.to_dict(),
            "adaptive": self.adaptive.to_dict() if self.adaptive is not None else None,
        }
