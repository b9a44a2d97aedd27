"""Splitting a dataset over virtual devices: IID, or non-IID by a Dirichlet over labels.

With a Dirichlet(alpha) split, each class's samples are dealt to the devices in
proportions drawn from Dirichlet(alpha, ..., alpha): a small alpha (0.1) gives each
device a few classes, a large one (100) approaches IID. Every device gets at least one
sample (taken from the largest partitions), so none is idle by construction.
"""

from __future__ import annotations

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


def _check(n_samples: int, devices: int) -> None:
    if devices < 1:
        raise AppError(f"devices must be >= 1, got {devices}")
    if n_samples < devices:
        raise AppError(f"{devices} devices need at least as many samples, the data has {n_samples}")
