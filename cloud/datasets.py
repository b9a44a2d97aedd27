"""Datasets: the 8x8 digits of scikit-learn and Fashion-MNIST from its IDX files.

Digits (the `datasets` extra): the split used everywhere in sporenet is the first 75% of
samples (1347) for training, the last 25% (450) for testing, in the file's order (no
shuffling before the split), so every component and document reports accuracy on the
same 450 images.

Fashion-MNIST: the 60,000 training and 10,000 test images of the four IDX files, as
Debian's `dataset-fashion-mnist` package installs them (or from a folder you name);
nothing is downloaded. Shakespeare's next character, one client per (play, role), is in
cloud/shakespeare.py.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sporenet.cloud.errors import ConfigError, DatasetError

DIGITS_TRAIN_SIZE = 1347
DIGITS_TEST_SIZE = 450
DIGITS_LABELS = [str(d) for d in range(10)]


@dataclass(frozen=True)
class Split:
    """Train and test arrays of one dataset."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    labels: list[str]


def load_digits(*, flat: bool = False) -> Split:
    """Raw pixels as float32 (0..16), images (N, 1, 8, 8) or with `flat` (N, 64);
    labels int64."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as exc:  # scikit-learn is the optional `datasets` extra
        raise ConfigError(
            "the digits dataset needs scikit-learn: pip install 'sporenet[datasets]'"
        ) from exc
    bunch = sk_load_digits()
    x = bunch.data.astype(np.float32)
    y = bunch.target.astype(np.int64)
    x = x if flat else x.reshape(-1, 1, 8, 8)
    n = DIGITS_TRAIN_SIZE
    return Split(
        x_train=np.ascontiguousarray(x[:n]),
        y_train=y[:n].copy(),
        x_test=np.ascontiguousarray(x[n:]),
        y_test=y[n:].copy(),
        labels=list(DIGITS_LABELS),
    )


FASHION_MNIST_LABELS = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
"""Where the loader looks when no path is given (after $SPORENET_FASHION_MNIST): the
folder Debian's `dataset-fashion-mnist` package installs."""
FASHION_MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
INSTALL_FASHION_MNIST = (
    "install Debian's package (apt-get install dataset-fashion-mnist), or pass the folder "
    "holding the four IDX files (train-images-idx3-ubyte[.gz], ...) as `path` or in "
    "$SPORENET_FASHION_MNIST"
)
_IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike, *, limit: int | None = None) -> np.ndarray:
    """An IDX file (plain or gzipped) as an array; with `limit`, only its first items."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or head[:2] != b"\0\0" or head[2] not in _IDX_TYPES:
            raise DatasetError(f"{path}: not an IDX file (magic {head.hex()!r})")
        dtype = _IDX_TYPES[head[2]]
        dims = np.frombuffer(f.read(4 * head[3]), ">u4").astype(np.int64)
        if len(dims) != head[3]:
            raise DatasetError(f"{path}: truncated header")
        count = int(dims[0]) if limit is None else min(int(dims[0]), limit)
        shape = (count, *(int(d) for d in dims[1:]))
        want = int(np.prod(shape)) * dtype.itemsize
        data = f.read(want)
    if len(data) != want:
        raise DatasetError(
            f"{path}: expected {want} bytes of data for {list(shape)}, found {len(data)}"
        )
    return np.frombuffer(data, dtype).reshape(shape)


def _fashion_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, f"{stem}.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def fashion_mnist_path(path: str | os.PathLike | None = None) -> Path:
    """The folder holding the Fashion-MNIST IDX files: `path`, $SPORENET_FASHION_MNIST,
    or where Debian's package puts them. DatasetError says how to install them."""
    given = path if path is not None else os.environ.get("SPORENET_FASHION_MNIST")
    candidates = [Path(given)] if given else [Path(d) for d in FASHION_MNIST_DIRS]
    for folder in candidates:
        if all(_fashion_file(folder, stem) for stem in FASHION_MNIST_FILES.values()):
            return folder
    raise DatasetError(
        f"Fashion-MNIST not found in {', '.join(map(str, candidates))}: {INSTALL_FASHION_MNIST}"
    )


def load_fashion_mnist(
    path: str | os.PathLike | None = None,
    *,
    flat: bool = False,
    train_limit: int | None = None,
    test_limit: int | None = None,
) -> Split:
    """Fashion-MNIST's standard split: raw pixels as float32 (0..255), images (N, 1, 28,
    28) or with `flat` (N, 784); labels int64. `train_limit`/`test_limit` read only the
    first images of each file (small slices for tests)."""
    for name, value in (("train_limit", train_limit), ("test_limit", test_limit)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(f"`{name}` must be a positive int or None, got {value!r}")
    folder = fashion_mnist_path(path)
    arrays = {}
    for key, stem in FASHION_MNIST_FILES.items():
        limit = train_limit if key.endswith("train") else test_limit
        arrays[key] = read_idx(_fashion_file(folder, stem), limit=limit)  # type: ignore[arg-type]
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.shape != (len(x),):
            raise DatasetError(
                f"{folder}: {part} images {list(x.shape)} and labels {list(y.shape)} are not "
                "Fashion-MNIST's (N, 28, 28) and (N,)"
            )
    shape = (-1, 784) if flat else (-1, 1, 28, 28)
    return Split(
        x_train=arrays["x_train"].astype(np.float32).reshape(shape),
        y_train=arrays["y_train"].astype(np.int64),
        x_test=arrays["x_test"].astype(np.float32).reshape(shape),
        y_test=arrays["y_test"].astype(np.int64),
        labels=list(FASHION_MNIST_LABELS),
    )


def random_shift(x: np.ndarray, rng: np.random.Generator, *, max_shift: int = 1) -> np.ndarray:
    """Augmentation for image batches (N, C, H, W): each image moved by up to `max_shift`
    pixels in each direction, the uncovered border filled with zeros. Pass it to fit as
    `augment=random_shift`."""
    if max_shift < 0:
        raise ConfigError(f"`max_shift` must be >= 0, got {max_shift}")
    n, _, h, w = x.shape
    s = max_shift
    padded = np.pad(x, ((0, 0), (0, 0), (s, s), (s, s)))
    dy = rng.integers(0, 2 * s + 1, size=(n,))
    dx = rng.integers(0, 2 * s + 1, size=(n,))
    rows = dy[:, None] + np.arange(h)[None, :]  # (N, H)
    cols = dx[:, None] + np.arange(w)[None, :]  # (N, W)
    batch = np.arange(n)[:, None, None, None]
    channel = np.arange(x.shape[1])[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]
