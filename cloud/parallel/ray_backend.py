"""The Ray backend: one actor per worker, so training can span the machines of a cluster.

Each step the driver puts the current parameters in Ray's object store once, every actor
computes its shard's scaled gradients (the same Replica as the local backend's workers),
and the driver sums them in worker order and runs the update itself (the same Updater).
The arithmetic is the local backend's, in the same order, so both give the same model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sporenet.cloud.errors import ConfigError
from sporenet.cloud.parallel.replica import GradientModel, Replica, Updater


class _Worker:
    """The actor's state: a Replica over its own copy of the parameters."""

    def __init__(self, spec: GradientModel) -> None:
        shapes = [spec.model.tensors[i].shape for _, i in spec.params]
        self.params = [np.zeros(shape, np.float32) for shape in shapes]
        self.out = [np.zeros(shape, np.float32) for shape in shapes]
        self.replica = Replica(
            spec, {name: p for (name, _), p in zip(spec.params, self.params, strict=True)}
        )

    def gradients(
        self, params: list[np.ndarray], x: np.ndarray, y: np.ndarray, share: float
    ) -> tuple[float, list[np.ndarray]]:
        for dst, src in zip(self.params, params, strict=True):
            np.copyto(dst, src)
        loss = self.replica.gradients(x, y, share, self.out)
        return loss, [g.copy() for g in self.out]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'DataParallel(backend="ray") needs Ray: pip install ray (or use backend="local")'
        ) from None
    return ray


class RayBackend:
    """Actors computing shard gradients; the driver reduces and updates."""

    def __init__(
        self,
        *,
        spec: GradientModel,
        workers: int,
        initial: dict[str, np.ndarray],
        address: str | None = None,
    ) -> None:
        ray = _ray()
        self.ray = ray
        self._started = False
        if not ray.is_initialized():
            # A local Ray unless an address names a cluster; no dashboard, quiet workers.
            ray.init(
                address=address,
                num_cpus=None if address else workers,
                include_dashboard=False,
                log_to_driver=False,
            )
            self._started = True
        self.names = [name for name, _ in spec.params]
        self.state = {n: np.array(v, copy=True) for n, v in initial.items()}
        self.updater = Updater(spec, self.state)
        actor = ray.remote(num_cpus=1)(_Worker)
        self.actors = [actor.remote(spec) for _ in range(workers)]

    def step(
        self, bounds: list[tuple[int, int]], x: np.ndarray, y: np.ndarray, lr: float
    ) -> list[float]:
        ray = self.ray
        params = ray.put([self.state[n] for n in self.names])
        n = len(x)
        futures = {
            k: self.actors[k].gradients.remote(params, x[lo:hi], y[lo:hi], (hi - lo) / n)
            for k, (lo, hi) in enumerate(bounds)
            if hi > lo
        }
        results = dict(zip(futures, ray.get(list(futures.values())), strict=True))
        zeros = [np.zeros_like(self.state[name]) for name in self.names]
        self.updater.apply(
            [results[k][1] if k in results else zeros for k in range(len(bounds))], lr
        )
        return [results[k][0] if k in results else 0.0 for k in range(len(bounds))]

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self._started:
            self.ray.shutdown()
