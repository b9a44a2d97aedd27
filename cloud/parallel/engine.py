"""The data-parallel engine behind fit(..., parallel=DataParallel(...)).

Each step splits the combined batch into one contiguous shard per worker. Every worker
computes its shard's gradients with graph mode's train graph, scaled by the shard's share
of the batch (Replica); the all-reduce sums them in worker order and graph mode's update
nodes run on the sum (Updater), which is the gradient of the combined batch's mean loss.
So the result equals single-process training on the combined batch within float
rounding (bit for bit with one worker).

The parameters and the optimizer's slots live in the backend's `state` (shared memory in
the local backend); `sync` copies them into the module and the Optimizer, so callbacks,
checkpoints and resuming work as with the other engines.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from sporenet.cloud.module import Module
from sporenet.cloud.optimizers import Optimizer
from sporenet.cloud.parallel.replica import GradientModel, gradient_model
from sporenet.cloud.trace import INPUT_NAME, LOGITS_NAME, trace
from sporenet.lite.interpreter import Interpreter


class Backend(Protocol):
    """Runs the workers: gradients of each shard, then the update of every parameter."""

    state: dict[str, np.ndarray]

    def step(
        self, bounds: list[tuple[int, int]], x: np.ndarray, y: np.ndarray, lr: float
    ) -> list[float]:
        """Shard k is rows bounds[k] of (x, y); returns each shard's mean loss."""

    def close(self) -> None:
        """Stop the workers and release their resources."""


def shard_bounds(n: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous shards of n rows, sizes differing by at most one."""
    edges = np.linspace(0, n, workers + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


class ParallelEngine:
    """fit's Engine for DataParallel: shards, all-reduce, one update per step."""

    def __init__(
        self,
        backend_factory: Any,
        model: Module,
        *,
        workers: int,
        sample_shape: Sequence[int],
        loss: str,
        optimizer: Optimizer,
        label_smoothing: float,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.workers = workers
        spec: GradientModel = gradient_model(
            model, sample_shape, loss=loss, optimizer=optimizer, label_smoothing=label_smoothing
        )
        self.names = [name for name, _ in spec.params]
        self.slots = {name: [s for s, _ in spec.slots[name]] for name in self.names}
        # Continue from the module's weights and the optimizer's saved slots (an earlier
        # fit, or a loaded checkpoint); a slot not saved yet starts as the graph's zeros.
        params = dict(model.named_parameters())
        saved = optimizer.state.slots
        initial = {}
        for name, i in spec.state():
            t = spec.model.tensors[i]
            value = params[name].value if name in params else saved.get(name, t.data)
            initial[name] = np.asarray(value, t.dtype).reshape(t.shape)
        self.backend: Backend = backend_factory(spec=spec, workers=workers, initial=initial)
        self.state: dict[str, np.ndarray] = self.backend.state

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        bounds = shard_bounds(len(x), self.workers)
        losses = self.backend.step(bounds, x, y, lr)
        self.optimizer.state.step += 1
        return float(sum(v * (b - a) for v, (a, b) in zip(losses, bounds, strict=True)) / len(x))

    def predict(self, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """Eval-mode outputs with the current weights (traced with them, planned here)."""
        self.sync()
        interpreter = Interpreter(model=trace(self.model, x.shape[1:], training=False))
        return np.concatenate(
            [
                interpreter.run({INPUT_NAME: x[i : i + batch_size]})[LOGITS_NAME]
                for i in range(0, len(x), batch_size)
            ]
        )

    def parameter(self, name: str) -> np.ndarray:
        """The parameter's live array in the engine's state (written by every update)."""
        return self.state[name]

    def sync(self) -> None:
        """Copy the weights and optimizer slots out of the engine's state."""
        params = dict(self.model.named_parameters())
        for name in self.names:
            np.copyto(params[name].value, self.state[name].reshape(params[name].value.shape))
            for s in self.slots[name]:
                self.optimizer.state.slots[s] = np.array(self.state[s], copy=True)

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self.backend.close()
