"""fit, evaluate and predict: the training loop over shuffled mini-batches, in either mode."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet.cloud._checks import non_negative_int, number, positive_int
from sporenet.cloud.callbacks import Callback, ProgressBar, TrainingState, plot_history
from sporenet.cloud.engines import make_engine
from sporenet.cloud.errors import ConfigError
from sporenet.cloud.losses import accuracy, compute_loss, loss_name
from sporenet.cloud.mode import resolve_mode
from sporenet.cloud.module import Module, run_eager, training_mode
from sporenet.cloud.optimizers import Optimizer, get_optimizer
from sporenet.cloud.trace import trace
from sporenet.lite.interpreter import Interpreter


@dataclass
class History:
    """Per-epoch logs of one fit: history["loss"], history["val_accuracy"], ..."""

    history: dict[str, list[float]] = field(default_factory=dict)
    epochs: list[int] = field(default_factory=list)
    mode: str = ""

    def __getitem__(self, key: str) -> list[float]:
        return self.history[key]


def _check_data(name: str, x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    y = np.asarray(y)
    if x.dtype.kind not in "fiu" or x.ndim < 2:
        raise ConfigError(
            f"`{name}` inputs must be a numeric array (N, ...), got {x.dtype} {list(x.shape)}"
        )
    if len(x) != len(y) or len(x) == 0:
        raise ConfigError(
            f"`{name}`: inputs and targets must have the same non-zero length, "
            f"got {len(x)} and {len(y)}"
        )
    return np.ascontiguousarray(x, dtype=np.float32), y


def _targets(y: np.ndarray, loss: str) -> np.ndarray:
    if loss == "softmax_cross_entropy" and y.dtype.kind in "iu":
        return y.astype(np.int64)
    return y.astype(np.float32)


def fit(
    model: Module,
    x: Any,
    y: Any,
    *,
    epochs: int,
    batch_size: int = 32,
    optimizer: Any = "adam",
    loss: str = "softmax_cross_entropy",
    validation_data: tuple[Any, Any] | None = None,
    callbacks: Sequence[Callback] = (),
    seed: int = 0,
    verbose: int = 1,
    mode: str | None = None,
    label_smoothing: float = 0.0,
    shuffle: bool = True,
    initial_epoch: int = 0,
    num_threads: int | None = None,
    plot: str | os.PathLike | None = None,
    augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    parallel: Any = None,
) -> History:
    """Train `model` on (x, y) for epochs [initial_epoch, epochs); returns the History.

    Mini-batches are reshuffled each epoch from (seed, epoch), so a run resumed from a
    checkpoint with `initial_epoch` sees the same batches as an uninterrupted one. The
    optimizer keeps its state across calls (pass the same instance to continue).
    `mode` overrides the global switch (`set_mode`). With `plot`, the curves are written
    to that PNG if matplotlib is installed. `augment(x_batch, rng)` transforms each training
    batch (e.g. datasets.random_shift); its generator is also drawn from (seed, epoch).
    With `parallel=DataParallel(workers=N, backend="local"|"ray")` each step's batch is
    split among N workers and their gradients all-reduced (cloud/parallel/); the workers
    run planned graphs, so the mode must be graph. The model is left in eval mode.
    """
    if not isinstance(model, Module):
        raise ConfigError(f"`model` must be a sporenet.cloud Module, got {type(model)}")
    run = _Run.checked(
        epochs=epochs,
        batch_size=batch_size,
        loss=loss,
        seed=seed,
        verbose=verbose,
        label_smoothing=label_smoothing,
        shuffle=shuffle,
        initial_epoch=initial_epoch,
        num_threads=num_threads,
        augment=augment,
    )
    opt = get_optimizer(optimizer)
    run_mode = resolve_mode(mode)
    _check_parallel(parallel, run_mode)
    data = _Data.checked(x, y, validation_data, run.loss)
    callbacks = _checked_callbacks(callbacks, run.verbose)

    model.input_shape = tuple(int(d) for d in data.x.shape[1:])  # export's default input shape
    state = TrainingState(
        model=model,
        optimizer=opt,
        lr=opt.lr,
        epochs=run.epochs,
        steps_per_epoch=run.steps(len(data.x)),
    )
    history = History(mode=run_mode)
    model.train()
    state.engine = _training_engine(parallel, run_mode, model, data, run, opt)
    try:
        _train(state, callbacks, data, run, history)
    finally:
        model.eval()
    state.history = history.history
    if plot is not None:
        plot_history(history.history, plot)
    return history


@dataclass(frozen=True)
class _Run:
    """fit's checked scalar options: how long, in what batches, with what loss."""

    epochs: int
    batch_size: int
    loss: str
    seed: int
    verbose: int
    label_smoothing: float
    shuffle: bool
    initial_epoch: int
    num_threads: int | None
    augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None

    @classmethod
    def checked(
        cls,
        *,
        epochs: Any,
        batch_size: Any,
        loss: str,
        seed: Any,
        verbose: Any,
        label_smoothing: Any,
        shuffle: bool,
        initial_epoch: Any,
        num_threads: Any,
        augment: Any,
    ) -> _Run:
        """The options as fit received them, checked (ConfigError names the bad one)."""
        epochs = positive_int("epochs", epochs)
        batch_size = positive_int("batch_size", batch_size)
        initial_epoch = non_negative_int("initial_epoch", initial_epoch)
        if initial_epoch >= epochs:
            raise ConfigError(f"`initial_epoch` ({initial_epoch}) must be < `epochs` ({epochs})")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"`seed` must be an int, got {seed!r}")
        if verbose not in (0, 1, 2):
            raise ConfigError(f"`verbose` must be 0, 1 or 2, got {verbose!r}")
        if num_threads is not None:
            positive_int("num_threads", num_threads)
        if augment is not None and not callable(augment):
            raise ConfigError(
                f"`augment` must be callable (x_batch, rng) -> x_batch, got {augment!r}"
            )
        label_smoothing = number(
            "label_smoothing", label_smoothing, low=0.0, high=1.0, high_open=True
        )
        return cls(
            epochs=epochs,
            batch_size=batch_size,
            loss=loss_name(loss),
            seed=seed,
            verbose=verbose,
            label_smoothing=label_smoothing,
            shuffle=shuffle,
            initial_epoch=initial_epoch,
            num_threads=num_threads,
            augment=augment,
        )

    def steps(self, n: int) -> int:
        """Optimizer steps per epoch over n samples (the last batch may be short)."""
        return (n + self.batch_size - 1) // self.batch_size


@dataclass(frozen=True)
class _Data:
    """The training arrays and the optional validation pair, checked and converted."""

    x: np.ndarray
    y: np.ndarray
    validation: tuple[np.ndarray, np.ndarray] | None

    @classmethod
    def checked(cls, x: Any, y: Any, validation_data: Any, loss: str) -> _Data:
        x, y = _check_data("x/y", x, y)
        validation = None
        if validation_data is not None:
            if not isinstance(validation_data, tuple | list) or len(validation_data) != 2:
                raise ConfigError("`validation_data` must be a pair (x_val, y_val)")
            vx, vy = _check_data("validation_data", *validation_data)
            validation = (vx, _targets(vy, loss))
        return cls(x, _targets(y, loss), validation)


def _check_parallel(parallel: Any, run_mode: str) -> None:
    if parallel is None:
        return
    from sporenet.cloud.parallel import DataParallel

    if not isinstance(parallel, DataParallel):
        raise ConfigError(f"`parallel` must be a DataParallel, got {type(parallel).__name__}")
    if run_mode != "graph":
        raise ConfigError("DataParallel workers run planned graphs: use mode='graph'")


def _checked_callbacks(callbacks: Sequence[Callback], verbose: int) -> list[Callback]:
    """The user's callbacks, checked, and the progress bar `verbose` asks for."""
    checked = list(callbacks)
    for k, cb in enumerate(checked):
        if not isinstance(cb, Callback):
            raise ConfigError(f"`callbacks[{k}]` must be a Callback, got {type(cb)}")
    if verbose:
        checked.append(ProgressBar(verbose=verbose))
    return checked


def _training_engine(
    parallel: Any, run_mode: str, model: Module, data: _Data, run: _Run, opt: Optimizer
) -> Any:
    """The engine that runs each step: data-parallel workers, or one process's mode."""
    if parallel is not None:
        from sporenet.cloud.parallel import make_parallel_engine

        return make_parallel_engine(
            parallel,
            model,
            sample_shape=data.x.shape[1:],
            loss=run.loss,
            optimizer=opt,
            label_smoothing=run.label_smoothing,
        )
    return make_engine(
        run_mode,
        model,
        sample_shape=data.x.shape[1:],
        loss=run.loss,
        optimizer=opt,
        label_smoothing=run.label_smoothing,
        num_threads=run.num_threads,
    )


def _train(
    state: TrainingState,
    callbacks: Sequence[Callback],
    data: _Data,
    run: _Run,
    history: History,
) -> None:
    """The epochs, between the callbacks' train hooks; the engine is closed after."""
    engine = state.engine
    for cb in callbacks:
        cb.on_train_begin(state)
    try:
        for epoch in range(run.initial_epoch, run.epochs):
            logs = _train_epoch(engine, state, callbacks, data, run, epoch)
            for k, v in logs.items():
                history.history.setdefault(k, []).append(float(v))
            history.epochs.append(epoch)
            if state.stop_training:
                break
    finally:
        engine.close()
        for cb in callbacks:
            cb.on_train_end(state)


def _train_epoch(
    engine: Any,
    state: TrainingState,
    callbacks: Sequence[Callback],
    data: _Data,
    run: _Run,
    epoch: int,
) -> dict[str, float]:
    """One epoch of steps over batches drawn from (seed, epoch); returns its logs."""
    state.epoch = epoch
    for cb in callbacks:
        cb.on_epoch_begin(epoch, state)
    x, y = data.x, data.y
    rng = np.random.default_rng([run.seed, epoch])
    order = rng.permutation(len(x)) if run.shuffle else np.arange(len(x))
    start = time.perf_counter()
    total, seen = 0.0, 0
    for b in range(state.steps_per_epoch):
        for cb in callbacks:
            cb.on_batch_begin(b, state)
        idx = order[b * run.batch_size : (b + 1) * run.batch_size]
        xb = (
            x[idx]
            if run.augment is None
            else np.ascontiguousarray(run.augment(x[idx], rng), dtype=np.float32)
        )
        value = engine.step(xb, y[idx], state.lr)
        total += value * len(idx)
        seen += len(idx)
        state.step += 1
        for cb in callbacks:
            cb.on_batch_end(b, {"loss": value}, state)
    engine.sync()
    logs = {"loss": total / seen}
    train_time = time.perf_counter() - start
    if data.validation is not None:
        vx, vy = data.validation
        out = engine.predict(vx)
        logs["val_loss"] = compute_loss(run.loss, out, vy)
        logs["val_accuracy"] = accuracy(out, vy)
    logs["time"] = train_time
    for cb in callbacks:
        cb.on_epoch_end(epoch, logs, state)
    return logs


def predict(
    model: Module,
    x: Any,
    *,
    batch_size: int = 512,
    mode: str | None = None,
    num_threads: int | None = None,
) -> np.ndarray:
    """The model's outputs on x in eval mode (graph mode: traced and planned once per call)."""
    batch_size = positive_int("batch_size", batch_size)
    x = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    if len(x) == 0:
        raise ConfigError("`x` is empty")
    with training_mode(model, False):
        if resolve_mode(mode) == "eager":
            parts = [run_eager(model, x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
        else:
            interpreter = Interpreter(
                model=trace(model, x.shape[1:], training=False), num_threads=num_threads
            )
            parts = [
                interpreter.run({"input": x[i : i + batch_size]})["logits"]
                for i in range(0, len(x), batch_size)
            ]
    return np.concatenate(parts)


def evaluate(
    model: Module,
    x: Any,
    y: Any,
    *,
    loss: str = "softmax_cross_entropy",
    batch_size: int = 512,
    mode: str | None = None,
) -> dict[str, float]:
    """Loss and accuracy of the model in eval mode."""
    name = loss_name(loss)
    x, y = _check_data("x/y", x, y)
    out = predict(model, x, batch_size=batch_size, mode=mode)
    y = _targets(y, name)
    return {"loss": compute_loss(name, out, y), "accuracy": accuracy(out, y)}
