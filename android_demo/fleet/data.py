"""What the virtual devices train on: a dataset chosen by name from an explicit table.

Each entry loads a `FleetData`: the training samples the devices split among themselves,
the held-out test samples the driver scores each round's global model on, and (for data
that come partitioned by nature, such as Shakespeare's speaking roles) the owner of each
training sample, which the `natural` partition follows.

    digits         scikit-learn's 8x8 digits (1,347 train / 450 test), pixels 0..16
    fashion-mnist  Fashion-MNIST's IDX files (60,000 / 10,000), pixels 0..255
    shakespeare    next character after 80, one owner per (play, role); see cloud.shakespeare

The loaders only read files installed on this machine; each says how to install its data.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sporenet.android_demo.errors import AppError

DIGITS_TRAIN_SIZE = 1347  # the split cloud.load_digits uses: the first 1347 train


@dataclass(frozen=True)
class FleetData:
    """Training samples for the devices, test samples for the driver, natural owners."""

    name: str
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    owners: np.ndarray | None = None  # owner index per training sample (natural partition)
    owner_names: list[str] = field(default_factory=list)
    test_owners: np.ndarray | None = None  # owner index per test sample

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or len(self.x_test) != len(self.y_test):
            raise AppError(
                f"{self.name}: {len(self.x)} samples for {len(self.y)} labels, "
                f"{len(self.x_test)} test samples for {len(self.y_test)} labels"
            )
        if self.owners is not None and len(self.owners) != len(self.y):
            raise AppError(f"{self.name}: {len(self.owners)} owners for {len(self.y)} samples")


def load_digits(path: str | None = None, limit: int | None = None) -> FleetData:
    """The 8x8 digits, images (N, 1, 8, 8) 0..16, read straight from the CSV file
    scikit-learn ships (importing scikit-learn would add tens of MB to every simulator
    process for one small table). `path` names another copy of that CSV file."""
    if path is None:
        spec = importlib.util.find_spec("sklearn")
        if spec is None or not spec.submodule_search_locations:
            raise AppError("the digits data are scikit-learn's: pip install 'sporenet[datasets]'")
        folder = Path(next(iter(spec.submodule_search_locations)))
        path = str(folder / "datasets/data/digits.csv.gz")
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    except OSError as exc:
        raise AppError(f"could not read the digits data at {path!r}: {exc}") from None
    x = np.ascontiguousarray(table[:, :64]).reshape(-1, 1, 8, 8)
    y = table[:, 64].astype(np.int64)
    n = DIGITS_TRAIN_SIZE
    stop = n if limit is None else min(n, limit)
    return FleetData("digits", x[:stop], y[:stop], x[n:], y[n:])


def load_fashion_mnist(path: str | None = None, limit: int | None = None) -> FleetData:
    """Fashion-MNIST from its IDX files (cloud.load_fashion_mnist finds them)."""
    from sporenet.cloud.datasets import load_fashion_mnist as load
    from sporenet.cloud.errors import CloudError

    try:
        split = load(path, train_limit=limit)
    except CloudError as exc:
        raise AppError(str(exc)) from None
    return FleetData("fashion-mnist", split.x_train, split.y_train, split.x_test, split.y_test)


def load_shakespeare(path: str | None = None, limit: int | None = None) -> FleetData:
    """Shakespeare's next character: one owner per (play, role) with enough lines; each
    role's training windows (at most `limit` per role) and a pooled test set of the
    roles' held-out speeches."""
    from sporenet.cloud.errors import CloudError
    from sporenet.cloud.shakespeare import load_shakespeare as load

    try:
        text = load(path)
    except CloudError as exc:
        raise AppError(str(exc)) from None
    per_role = limit if limit is not None else 1000
    xs, ys, owners, tx, ty, tested = [], [], [], [], [], []
    for k, client in enumerate(text.clients):
        x, y = client.train_examples(per_role)
        xs.append(x)
        ys.append(y)
        owners.append(np.full(len(y), k, np.int64))
        x, y = client.test_examples(max(1, per_role // 4))
        tx.append(x)
        ty.append(y)
        tested.append(np.full(len(y), k, np.int64))
    return FleetData(
        "shakespeare",
        np.concatenate(xs).astype(np.float32),
        np.concatenate(ys),
        np.concatenate(tx).astype(np.float32),
        np.concatenate(ty),
        owners=np.concatenate(owners),
        owner_names=[c.name for c in text.clients],
        test_owners=np.concatenate(tested),
    )


DATASETS: dict[str, Callable[[str | None, int | None], FleetData]] = {
    "digits": load_digits,
    "fashion-mnist": load_fashion_mnist,
    "shakespeare": load_shakespeare,
}


def load(name: str, path: str | None = None, limit: int | None = None) -> FleetData:
    """The dataset `name` (see DATASETS); `limit` caps the training samples (per role
    for Shakespeare)."""
    loader = DATASETS.get(name)
    if loader is None:
        raise AppError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}")
    if limit is not None and limit < 1:
        raise AppError(f"the sample limit must be >= 1, got {limit}")
    return loader(path, limit)
