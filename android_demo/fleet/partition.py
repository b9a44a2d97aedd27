"""Splitting a dataset over virtual devices: IID, non-IID by a Dirichlet over labels, or
natural (each device holds one owner's samples, e.g. one Shakespeare role), chosen by name
from PARTITIONS.

With a Dirichlet(alpha) split, each class's samples are dealt to the devices in
proportions drawn from Dirichlet(alpha, ..., alpha): a small alpha (0.1) gives each
device a few classes, a large one (100) approaches IID. Every device gets at least one
sample (taken from the largest partitions), so none is idle by construction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sporenet.android_demo.errors import AppError


def iid(n_samples: int, devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sample indices per device: a random permutation cut into near-equal parts."""
    _check(n_samples, devices)
    return [np.sort(p) for p in np.array_split(rng.permutation(n_samples), devices)]


def dirichlet(
    labels: np.ndarray, devices: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Sample indices per device, each class split by Dirichlet(alpha) proportions."""
    _check(len(labels), devices)
    if not alpha > 0:
        raise AppError(f"the Dirichlet alpha must be > 0, got {alpha}")
    parts: list[list[int]] = [[] for _ in range(devices)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(devices, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for d, chunk in enumerate(np.split(members, cuts)):
            parts[d].extend(chunk.tolist())
    for d in range(devices):  # no empty device: take one sample from the largest
        if not parts[d]:
            donor = max(range(devices), key=lambda k: len(parts[k]))
            parts[d].append(parts[donor].pop())
    return [np.sort(np.array(p, np.int64)) for p in parts]


def natural(owners: np.ndarray | None, devices: int) -> list[np.ndarray]:
    """Sample indices per device: device k holds owner k's samples (the first `devices`
    owners; a dataset without owners has no natural split)."""
    if owners is None:
        raise AppError("this dataset has no natural owners; use the iid or dirichlet partition")
    found = int(owners.max()) + 1 if len(owners) else 0
    if not 1 <= devices <= found:
        raise AppError(f"the natural partition has {found} owners, {devices} devices asked")
    return [np.flatnonzero(owners == k) for k in range(devices)]


Partitioner = Callable[[np.ndarray, "np.ndarray | None", int, float, np.random.Generator], list]
PARTITIONS: dict[str, Partitioner] = {
    "iid": lambda labels, owners, devices, alpha, rng: iid(len(labels), devices, rng),
    "dirichlet": lambda labels, owners, devices, alpha, rng: dirichlet(labels, devices, alpha, rng),
    "natural": lambda labels, owners, devices, alpha, rng: natural(owners, devices),
}
"""(labels, owners, devices, alpha, rng) -> sample indices per device, by name."""


def _check(n_samples: int, devices: int) -> None:
    if devices < 1:
        raise AppError(f"devices must be >= 1, got {devices}")
    if n_samples < devices:
        raise AppError(f"{devices} devices need at least as many samples, the data has {n_samples}")
