"""Magnitude pruning: zero the smallest weights, by a polynomial schedule during `fit`.

`Pruning` is a fit callback (TensorFlow Model Optimization's prune_low_magnitude, as a
callback): every `frequency` optimizer steps between `begin_step` and `end_step` it
raises the target sparsity along `PolynomialSparsity`, recomputes each pruned weight's
mask from the magnitudes (per layer, or one threshold over all of them with
`scope="global"`) and, after every step, multiplies the weights by their masks in the
engine's live arrays, so pruned weights stay exactly zero through the optimizer's updates
(its momentum would otherwise move them again) and through later fine-tuning with the
same callback. The masks are kept on the callback and checked by `sparsity_of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from sporenet.cloud._checks import non_negative_int, number, positive_int
from sporenet.cloud.callbacks import Callback, TrainingState
from sporenet.cloud.errors import ConfigError
from sporenet.cloud.layers import Conv2d, Dense
from sporenet.cloud.module import Module

SCOPES = ("layer", "global")


@dataclass(frozen=True)
class PolynomialSparsity:
    """Sparsity at optimizer step t: `initial` before `begin_step`, `final` from
    `end_step` on, and in between final + (initial - final) * (1 - progress) ** power,
    progress = (t - begin_step) / (end_step - begin_step) (Zhu & Gupta, 2017)."""

    final: float
    begin_step: int
    end_step: int
    initial: float = 0.0
    power: float = 3.0

    def __post_init__(self) -> None:
        number("initial", self.initial, low=0.0, high=1.0, high_open=True)
        number("final", self.final, low=0.0, high=1.0, high_open=True)
        non_negative_int("begin_step", self.begin_step)
        positive_int("end_step", self.end_step)
        if self.end_step <= self.begin_step:
            raise ConfigError(
                f"`end_step` ({self.end_step}) must be after `begin_step` ({self.begin_step})"
            )
        number("power", self.power, low=0.0, low_open=True)

    def __call__(self, step: int) -> float:
        progress = min(max((step - self.begin_step) / (self.end_step - self.begin_step), 0.0), 1.0)
        return self.final + (self.initial - self.final) * (1.0 - progress) ** self.power


def prunable_weights(model: Module) -> dict[str, np.ndarray]:
    """The weights magnitude pruning applies to by default: every Conv2d and Dense weight
    (biases, BatchNorm parameters and depthwise filters are left dense), by dotted path."""
    names = {id(p): n for n, p in model.named_parameters()}
    found = {}
    for _, module in model.named_modules():
        if isinstance(module, Conv2d | Dense) and not (
            isinstance(module, Conv2d) and module.groups > 1
        ):
            found[names[id(module.weight)]] = module.weight.value
    return found


def magnitude_masks(
    weights: Mapping[str, np.ndarray], sparsity: float, *, scope: str = "layer"
) -> dict[str, np.ndarray]:
    """Boolean keep-masks zeroing the `sparsity` fraction of smallest |w|: within each
    tensor (scope "layer") or over all of them together (scope "global")."""
    number("sparsity", sparsity, low=0.0, high=1.0, high_open=True)
    if scope not in SCOPES:
        raise ConfigError(f"`scope` must be one of {list(SCOPES)}, got {scope!r}")
    if scope == "global":
        everything = np.concatenate([np.abs(w).reshape(-1) for w in weights.values()])
        threshold = _threshold(everything, sparsity)
        return {n: _keep(w, threshold, sparsity) for n, w in weights.items()}
    return {
        n: _keep(w, _threshold(np.abs(w).reshape(-1), sparsity), sparsity)
        for n, w in weights.items()
    }


def _threshold(magnitudes: np.ndarray, sparsity: float) -> float:
    k = round(sparsity * magnitudes.size)
    if k == 0:
        return -1.0
    return float(np.partition(magnitudes, k - 1)[k - 1])


def _keep(w: np.ndarray, threshold: float, sparsity: float) -> np.ndarray:
    keep = np.abs(w) > threshold
    if sparsity > 0 and threshold == 0.0:
        keep &= w != 0  # zeros are pruned whatever their count
    return keep


def sparsity_of(weights: Iterable[np.ndarray]) -> float:
    """Fraction of exact zeros over all the given arrays."""
    arrays = list(weights)
    total = sum(a.size for a in arrays)
    return float(sum(a.size - np.count_nonzero(a) for a in arrays) / max(total, 1))


class Pruning(Callback):
    """Magnitude pruning during `fit` (see the module docstring).

    Args:
        schedule: target sparsity by optimizer step (a PolynomialSparsity, or any
            callable step -> fraction in [0, 1)).
        scope: "layer" (each weight pruned to the target) or "global" (one magnitude
            threshold over all pruned weights).
        weights: dotted paths of the weights to prune; default `prunable_weights(model)`.
        frequency: steps between mask updates while the schedule rises.
    Raises:
        ConfigError: a bad scope, frequency or weight name (when training starts).
    """

    def __init__(
        self,
        schedule: PolynomialSparsity,
        *,
        scope: str = "layer",
        weights: Iterable[str] | None = None,
        frequency: int = 10,
    ) -> None:
        if not callable(schedule):
            raise ConfigError(f"`schedule` must map a step to a sparsity, got {schedule!r}")
        if scope not in SCOPES:
            raise ConfigError(f"`scope` must be one of {list(SCOPES)}, got {scope!r}")
        self.schedule = schedule
        self.scope = scope
        self.requested = list(weights) if weights is not None else None
        self.names: list[str] = []  # the weights pruned, fixed when training begins
        self.frequency = positive_int("frequency", frequency)
        self.masks: dict[str, np.ndarray] = {}
        self.step = 0  # optimizer steps seen over every fit this callback took part in

    def on_train_begin(self, state: TrainingState) -> None:
        available = prunable_weights(state.model)
        names = self.requested if self.requested is not None else list(available)
        params = dict(state.model.named_parameters())
        unknown = [n for n in names if n not in params]
        if unknown:
            raise ConfigError(
                f"cannot prune unknown weights {unknown}; the model's "
                f"prunable weights are {sorted(available)}"
            )
        self.names = names
        for name in names:
            self.masks.setdefault(name, np.ones(params[name].shape, bool))
        self._apply(state)

    def on_batch_end(self, step: int, logs: dict[str, float], state: TrainingState) -> None:
        self.step += 1
        end = getattr(self.schedule, "end_step", None)
        rising = end is None or self.step <= end
        if (rising and self.step % self.frequency == 0) or self.step == end:
            self._update(state)
        self._apply(state)

    def _update(self, state: TrainingState) -> None:
        current = {n: state.engine.parameter(n) for n in self.names}
        target = float(self.schedule(self.step))
        fresh = magnitude_masks(current, target, scope=self.scope)
        for n in self.names:
            self.masks[n] &= fresh[n].reshape(self.masks[n].shape)

    def _apply(self, state: TrainingState) -> None:
        for name, mask in self.masks.items():
            live = state.engine.parameter(name)
            np.copyto(live, 0.0, where=~mask.reshape(live.shape))

    def on_train_end(self, state: TrainingState) -> None:
        params = dict(state.model.named_parameters())
        for name, mask in self.masks.items():
            np.copyto(params[name].value, 0.0, where=~mask)


def prune_now(
    model: Module, sparsity: float, *, scope: str = "layer", weights: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """One-shot magnitude pruning of the model's weights in place (no schedule, no
    fine-tuning); returns the keep-masks by weight name."""
    params = dict(model.named_parameters())
    names = list(weights) if weights is not None else list(prunable_weights(model))
    masks = magnitude_masks({n: params[n].value for n in names}, sparsity, scope=scope)
    for n, mask in masks.items():
        np.copyto(params[n].value, 0.0, where=~mask)
    return masks
