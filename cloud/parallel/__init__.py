"""Data-parallel training: fit(..., parallel=DataParallel(workers=N, backend=...)).

    cloud.fit(model, x, y, epochs=5, batch_size=128,
              parallel=cloud.DataParallel(workers=2, backend="local"))

Each step's batch (`batch_size` is the combined batch) is split into one shard per
worker; each worker computes its shard's gradients with the planned IR graph; the
gradients are all-reduced (summed, weighted by shard size) and one update is applied,
so the model equals single-process training on the combined batch within float
rounding. Backends: "local" (processes on this machine over shared memory) and "ray"
(Ray actors, so workers can span a cluster; `pip install ray`).

Toward model parallelism: the same gradient graph is an IR graph, so operator sharding
(the seeds' plan) is a graph pass: split a large FULLY_CONNECTED or CONV2D along its
output channels into per-worker nodes, give each worker its slice of the weight, and put
the collective the split needs (a CONCAT of the activations forward, a sum of the input
gradients backward) at the cut. The engine then keeps its shape: workers run their
slice of the graph, and the backend moves activations between them instead of only
gradients. docs/autodiff.md says more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sporenet.cloud._checks import choice, positive_int
from sporenet.cloud.module import Module
from sporenet.cloud.optimizers import Optimizer

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class DataParallel:
    """How fit spreads each step over workers; checked when built."""

    workers: int = 2
    backend: str = "local"
    address: str | None = None  # a Ray cluster's address (backend="ray"); None: local Ray

    def __post_init__(self) -> None:
        positive_int("workers", self.workers)
        choice("backend", self.backend, BACKENDS)


def make_parallel_engine(
    parallel: DataParallel,
    model: Module,
    *,
    sample_shape: Sequence[int],
    loss: str,
    optimizer: Optimizer,
    label_smoothing: float,
) -> Any:
    """fit's engine for `parallel`."""
    from sporenet.cloud.parallel.engine import ParallelEngine

    if parallel.backend == "local":
        from sporenet.cloud.parallel.local import LocalBackend

        factory: Any = LocalBackend
    else:
        from functools import partial

        from sporenet.cloud.parallel.ray_backend import RayBackend

        factory = partial(RayBackend, address=parallel.address)
    return ParallelEngine(
        factory,
        model,
        workers=parallel.workers,
        sample_shape=sample_shape,
        loss=loss,
        optimizer=optimizer,
        label_smoothing=label_smoothing,
    )


__all__ = ["BACKENDS", "DataParallel", "make_parallel_engine"]
