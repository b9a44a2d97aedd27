"""L2 clipping of updates, fixed and adaptive (the sensitivity bound DP noise is sized to).

An update is a flat array or a dict of named arrays (one model delta); its norm is the
global L2 norm over all tensors. Adaptive clipping follows Andrew et al. 2021
("Differentially private learning with adaptive clipping"): the norm tracks a target
quantile of the clients' update norms by a geometric step on a noised count of the
clients that were not clipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sporenet.federated.privacy.errors import PrivacyConfigError

Update = np.ndarray | Mapping[str, np.ndarray]


def l2_norm(update: Update) -> float:
    """Global L2 norm of an array or of all arrays of a named update."""
    if isinstance(update, Mapping):
        return math.sqrt(
            sum(float(np.sum(np.square(a, dtype=np.float64))) for a in update.values())
        )
    return float(np.sqrt(np.sum(np.square(update, dtype=np.float64))))


def clip_l2(update: Update, clipping_norm: float) -> tuple[Update, float]:
    """(update scaled to norm <= clipping_norm, its original norm); inputs are not modified."""
    norm = l2_norm(update)
    factor = min(1.0, clipping_norm / norm) if norm > 0 else 1.0
    if isinstance(update, Mapping):
        return {k: np.asarray(v, np.float64) * factor for k, v in update.items()}, norm
    return np.asarray(update, np.float64) * factor, norm


def check_positive(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Validate a finite positive number setting, naming it in the error."""
    bound = ">= 0" if allow_zero else "> 0"
    error = PrivacyConfigError(f"`{name}` must be a finite number {bound}, found {value!r}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise error
    return float(value)


def add_gaussian(update: Update, std: float, rng: np.random.Generator) -> Update:
    """update + N(0, std²) per coordinate (a new array or dict)."""
    if isinstance(update, np.ndarray):
        return update + rng.normal(0.0, std, update.shape)
    return {k: np.asarray(v) + rng.normal(0.0, std, np.shape(v)) for k, v in update.items()}


@dataclass
class AdaptiveClipping:
    """The clipping norm as persisted state that follows a quantile of update norms.

    - `target_quantile` γ: the fraction of updates that should be left unclipped;
    - `learning_rate` η: the geometric step, C <- C·exp(-η(b - γ)), b the unclipped fraction;
    - `count_noise_multiplier` σ_b: the noise on the unclipped count (it is also released).
    """

    clipping_norm: float = 0.1
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise_multiplier: float = 0.0

    def __post_init__(self) -> None:
        check_positive("clipping_norm", self.clipping_norm)
        check_positive("learning_rate", self.learning_rate)
        check_positive("count_noise_multiplier", self.count_noise_multiplier, allow_zero=True)
        if not (isinstance(self.target_quantile, float) and 0.0 < self.target_quantile < 1.0):
            raise PrivacyConfigError(
                f"`target_quantile` must be a float in (0, 1), found {self.target_quantile!r}"
            )

    def update(
        self,
        norms: np.ndarray | list[float],
        rng: np.random.Generator,
        *,
        expected: int | None = None,
    ) -> float:
        """Move the norm after a round whose clients had these (pre-clipping) norms.

        `expected`: the expected number of sampled clients, the denominator that keeps the
        released fraction's sensitivity fixed (default: the number of norms).
        """
        norms = np.asarray(norms, np.float64)
        if norms.size == 0:
            return self.clipping_norm
        unclipped = float(np.sum(norms <= self.clipping_norm))
        if self.count_noise_multiplier > 0:
            unclipped += rng.normal(0.0, self.count_noise_multiplier)
        fraction = unclipped / (expected or norms.size)
        self.clipping_norm *= math.exp(-self.learning_rate * (fraction - self.target_quantile))
        return self.clipping_norm

    def to_dict(self) -> dict[str, Any]:
        return {
            "clipping_norm": self.clipping_norm,
            "target_quantile": self.target_quantile,
            "learning_rate": self.learning_rate,
            "count_noise_multiplier": self.count_noise_multiplier,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AdaptiveClipping:
        try:
            return cls(
                **{
                    k: d[k]
                    for k in (
                        "clipping_norm",
                        "target_quantile",
                        "learning_rate",
                        "count_noise_multiplier",
                    )
                }
            )
        except (KeyError, TypeError) as e:
            raise PrivacyConfigError(f"adaptive clipping state is malformed: {e!r}") from None


def update_noise_multiplier(noise_multiplier: float, count_noise_multiplier: float) -> float:
    """The noise left for the update sum when the unclipped count is released too.

    Andrew et al. 2021, Theorem 1: releasing both is like one Gaussian mechanism with
    multiplier z iff z_Δ = (z^-2 - (2σ_b)^-2)^(-1/2); requires σ_b > z/2.
    """
    if count_noise_multiplier == 0:
        return noise_multiplier
    rest = noise_multiplier**-2 - (2 * count_noise_multiplier) ** -2
    if rest <= 0:
        raise PrivacyConfigError(
            f"`count_noise_multiplier` must exceed noise_multiplier/2 = {noise_multiplier / 2}, "
            f"found {count_noise_multiplier}"
        )
    return rest**-0.5
