"""The daemon's `[differential_privacy]` settings, checked once when they are built.

    [differential_privacy]
    enabled = true
    mode = "central"            # central: the server clips and noises; distributed: each
                                # client adds its share under secure aggregation; local:
                                # each client adds all of it (no trust in the server)
    noise_multiplier = 1.0      # z: noise std on the sum is z·C
    clipping_norm = 1.0         # C (the initial C with adaptive clipping)
    adaptive_clipping = false   # C follows a quantile of the update norms (central only)
    target_quantile = 0.5
    clipping_learning_rate = 0.2
    count_noise_multiplier = 2.0  # noise on the released unclipped count; > z/2 (adaptive)
    delta = 1e-5
    epsilon_budget = 8.0        # optional: the job finishes before a round would exceed it

Every message names the key as it is spelled in the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sporenet.federated.privacy.clipping import AdaptiveClipping
from sporenet.federated.privacy.errors import PrivacyConfigError

MODES = ("central", "distributed", "local")
SECTION = "differential_privacy"


@dataclass(frozen=True, kw_only=True)
class DPConfig:
    """Differential privacy of a job's fit rounds (see the module docstring)."""

    mode: str = "central"
    noise_multiplier: float = 1.0
    clipping_norm: float = 1.0
    adaptive_clipping: bool = False
    target_quantile: float = 0.5
    clipping_learning_rate: float = 0.2
    count_noise_multiplier: float | None = None
    delta: float = 1e-5
    epsilon_budget: float | None = None

    def __post_init__(self) -> None:
        def bad(key: str, rule: str) -> PrivacyConfigError:
            return PrivacyConfigError(f"`{SECTION}.{key}` {rule}, got {getattr(self, key)!r}")

        if self.mode not in MODES:
            raise bad("mode", f"must be one of {list(MODES)}")
        for key in ("noise_multiplier", "clipping_norm", "clipping_learning_rate"):
            v = getattr(self, key)
            if not (_number(v) and math.isfinite(v) and v > 0):
                raise bad(key, "must be a finite number > 0")
        if not (_number(self.target_quantile) and 0.0 < self.target_quantile < 1.0):
            raise bad("target_quantile", "must be in (0, 1)")
        if not (_number(self.delta) and 0.0 < self.delta < 1.0):
            raise bad("delta", "must be in (0, 1)")
        if self.epsilon_budget is not None and not (
            _number(self.epsilon_budget)
            and math.isfinite(self.epsilon_budget)
            and self.epsilon_budget > 0
        ):
            raise bad("epsilon_budget", "must be a finite number > 0")
        if self.adaptive_clipping:
            if self.mode != "central":
                raise bad(
                    "adaptive_clipping",
                    'is only supported with mode = "central" (clients would need the'
                    " released norm each round)",
                )
            c = self.count_noise_multiplier
            # The unclipped count is released too; with too little noise on it nothing is
            # left for the sum (Andrew et al. 2021, Theorem 1).
            if c is None or not (_number(c) and math.isfinite(c) and c > self.noise_multiplier / 2):
                raise bad(
                    "count_noise_multiplier",
                    f"must be a number > noise_multiplier/2 = {self.noise_multiplier / 2:g}"
                    " with adaptive clipping (the unclipped count is released with noise)",
                )
        elif self.count_noise_multiplier is not None:
            raise bad("count_noise_multiplier", "only applies with adaptive_clipping = true")

    def adaptive(self) -> AdaptiveClipping | None:
        """A fresh adaptive clipping state at the initial norm (None for a fixed norm)."""
        if not self.adaptive_clipping:
            return None
        return AdaptiveClipping(
            clipping_norm=float(self.clipping_norm),
            target_quantile=float(self.target_quantile),
            learning_rate=float(self.clipping_learning_rate),
            count_noise_multiplier=float(self.count_noise_multiplier or 0.0),
        )


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_TYPES: dict[str, tuple[type[Any], ...]] = {
    "enabled": (bool,),
    "mode": (str,),
    "noise_multiplier": (int, float),
    "clipping_norm": (int, float),
    "adaptive_clipping": (bool,),
    "target_quantile": (int, float),
    "clipping_learning_rate": (int, float),
    "count_noise_multiplier": (int, float),
    "delta": (int, float),
    "epsilon_budget": (int, float),
}


def dp_config_from_table(table: Any) -> DPConfig | None:
    """The DPConfig of a `[differential_privacy]` table (None when it is not enabled)."""
    if not isinstance(table, dict):
        raise PrivacyConfigError(f"`{SECTION}` must be a table, got {table!r}")
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        types = _TYPES.get(key)
        if types is None:
            raise PrivacyConfigError(f"unknown key `{SECTION}.{key}`; known keys: {sorted(_TYPES)}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise PrivacyConfigError(f"`{SECTION}.{key}` must be {names}, got {value!r}")
        if key != "enabled":
            kwargs[key] = float(value) if float in types else value
    if not table.get("enabled", False):
        return None
    return DPConfig(**kwargs)
