"""Callbacks: hooks fit calls around epochs and batches (checkpoint, early stopping,
learning-rate schedule, progress output)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from sporenet.cloud._checks import choice, non_negative_int, number
from sporenet.cloud.checkpoint import save_checkpoint
from sporenet.cloud.errors import ConfigError
from sporenet.cloud.module import Module
from sporenet.cloud.optimizers import Optimizer


@dataclass
class TrainingState:
    """What callbacks see and may change: the learning rate and `stop_training`.

    `engine` is the running training engine: a callback that edits weights between steps
    (pruning masks) writes into `engine.parameter(name)`, the array the next step reads.
    """

    model: Module
    optimizer: Optimizer
    lr: float
    epochs: int
    steps_per_epoch: int
    epoch: int = 0
    step: int = 0  # optimizer steps done in this fit
    stop_training: bool = False
    history: dict[str, list[float]] = field(default_factory=dict)
    engine: Any = None


class Callback:
    """Base class; override the hooks you need."""

    def on_train_begin(self, state: TrainingState) -> None:
        pass

    def on_epoch_begin(self, epoch: int, state: TrainingState) -> None:
        pass

    def on_batch_begin(self, step: int, state: TrainingState) -> None:
        pass

    def on_batch_end(self, step: int, logs: dict[str, float], state: TrainingState) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: dict[str, float], state: TrainingState) -> None:
        pass

    def on_train_end(self, state: TrainingState) -> None:
        pass


def _better(mode: str, monitor: str) -> str:
    if mode != "auto":
        return mode
    return "max" if "acc" in monitor else "min"


class _Monitor:
    """Tracks the best value of a logged metric."""

    def __init__(self, monitor: str, mode: str, min_delta: float) -> None:
        self.monitor = monitor
        self.mode = _better(choice("mode", mode, ["auto", "min", "max"]), monitor)
        self.min_delta = min_delta
        self.best = math.inf if self.mode == "min" else -math.inf

    def value(self, logs: dict[str, float]) -> float:
        if self.monitor not in logs:
            raise ConfigError(
                f"`monitor` is {self.monitor!r} but the logs have {sorted(logs)} "
                "(val_* metrics need validation_data)"
            )
        return float(logs[self.monitor])

    def improved(self, value: float) -> bool:
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta


class ModelCheckpoint(Callback):
    """Save a checkpoint at the end of each epoch (or only when `monitor` improves).

    `path` may contain "{epoch}" (1-based epoch number)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        monitor: str = "val_loss",
        save_best_only: bool = False,
        mode: str = "auto",
    ) -> None:
        self.path = str(path)
        self.save_best_only = bool(save_best_only)
        self.tracker = _Monitor(monitor, mode, 0.0)
        self.saved: list[Path] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, float], state: TrainingState) -> None:
        if self.save_best_only:
            value = self.tracker.value(logs)
            if not self.tracker.improved(value):
                return
            self.tracker.best = value
        path = Path(self.path.format(epoch=epoch + 1))
        save_checkpoint(
            path, state.model, optimizer=state.optimizer, epoch=epoch + 1, extra={"logs": logs}
        )
        self.saved.append(path)


class EarlyStopping(Callback):
    """Stop when `monitor` has not improved by `min_delta` for `patience` epochs; with
    `restore_best_weights` the model ends with the weights of its best epoch."""

    def __init__(
        self,
        *,
        monitor: str = "val_loss",
        patience: int = 3,
        min_delta: float = 0.0,
        mode: str = "auto",
        restore_best_weights: bool = True,
    ) -> None:
        self.patience = non_negative_int("patience", patience)
        self.tracker = _Monitor(monitor, mode, number("min_delta", min_delta, low=0.0))
        self.restore_best_weights = bool(restore_best_weights)
        self.wait = 0
        self.best_state: dict[str, np.ndarray] | None = None
        self.best_epoch = -1
        self.stopped_epoch: int | None = None

    def on_train_begin(self, state: TrainingState) -> None:
        self.wait, self.best_state, self.best_epoch, self.stopped_epoch = 0, None, -1, None
        self.tracker.best = math.inf if self.tracker.mode == "min" else -math.inf

    def on_epoch_end(self, epoch: int, logs: dict[str, float], state: TrainingState) -> None:
        value = self.tracker.value(logs)
        if self.tracker.improved(value):
            self.tracker.best, self.wait, self.best_epoch = value, 0, epoch
            if self.restore_best_weights:
                self.best_state = state.model.state_dict()
            return
        self.wait += 1
        if self.wait > self.patience:
            state.stop_training = True
            self.stopped_epoch = epoch

    def on_train_end(self, state: TrainingState) -> None:
        if self.restore_best_weights and self.best_state is not None:
            state.model.load_state_dict(self.best_state)


class LearningRateScheduler(Callback):
    """Set the learning rate from `schedule(t)` with t the epoch (unit="epoch") or the
    optimizer step (unit="step"), counted from 0 across resumed fits."""

    def __init__(self, schedule: Callable[[int], float], *, unit: str = "epoch") -> None:
        if not callable(schedule):
            raise ConfigError(f"`schedule` must be callable, got {schedule!r}")
        self.schedule = schedule
        self.unit = choice("unit", unit, ["epoch", "step"])

    def _set(self, t: int, state: TrainingState) -> None:
        lr = float(self.schedule(t))
        if not lr > 0 or not math.isfinite(lr):
            raise ConfigError(f"`schedule` returned learning rate {lr!r} at {self.unit} {t}")
        state.lr = lr

    def on_epoch_begin(self, epoch: int, state: TrainingState) -> None:
        if self.unit == "epoch":
            self._set(epoch, state)

    def on_batch_begin(self, step: int, state: TrainingState) -> None:
        if self.unit == "step":
            self._set(state.optimizer.state.step, state)

    def on_epoch_end(self, epoch: int, logs: dict[str, float], state: TrainingState) -> None:
        logs["lr"] = state.lr


class ProgressBar(Callback):
    """verbose=1: a bar redrawn in place (a line per epoch when not a terminal);
    verbose=2: one line per epoch."""

    def __init__(self, *, verbose: int = 1, stream: TextIO | None = None, width: int = 24) -> None:
        self.verbose = verbose
        self.stream = stream or sys.stdout
        self.width = width
        self.interactive = verbose == 1 and getattr(self.stream, "isatty", lambda: False)()

    def on_epoch_begin(self, epoch: int, state: TrainingState) -> None:
        self.start = time.perf_counter()
        self.loss_sum, self.count = 0.0, 0

    def on_batch_end(self, step: int, logs: dict[str, float], state: TrainingState) -> None:
        self.loss_sum += logs["loss"]
        self.count += 1
        if self.interactive:
            done = self.count / max(state.steps_per_epoch, 1)
            bar = "=" * int(done * self.width)
            self.stream.write(
                f"\repoch {state.epoch + 1}/{state.epochs} [{bar:<{self.width}}] "
                f"loss {self.loss_sum / self.count:.4f}"
            )
            self.stream.flush()

    def on_epoch_end(self, epoch: int, logs: dict[str, float], state: TrainingState) -> None:
        shown = "  ".join(
            f"{k} {v:.4f}" if k != "lr" else f"lr {v:.2e}" for k, v in logs.items() if k != "time"
        )
        line = (
            f"epoch {epoch + 1}/{state.epochs}  {shown}  ({time.perf_counter() - self.start:.2f}s)"
        )
        self.stream.write(("\r" + line + " " * 8 if self.interactive else line) + "\n")
        self.stream.flush()


def plot_history(history: dict[str, list[float]], path: str | os.PathLike) -> Path | None:
    """Write the training curves to a PNG if matplotlib is installed (it is not a
    dependency); returns the path, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for key, values in history.items():
        if key in ("lr", "time"):
            continue
        ax = axes[1] if "acc" in key else axes[0]
        ax.plot(range(1, len(values) + 1), values, label=key)
    for ax, title in zip(axes, ("loss", "accuracy"), strict=True):
        ax.set_xlabel("epoch")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
