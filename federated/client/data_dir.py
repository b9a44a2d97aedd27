"""A client's local data as a folder of .npz files, for `sporenet-client`.

Each `*.npz` holds `x` (samples along axis 0, in the model's input layout or flat rows of
the same size) and `y` (integer labels). Files whose name starts with `eval` are the
evaluation data; without one, every fifth sample is held out for evaluation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sporenet.federated.errors import ConfigError

HOLDOUT_EVERY = 5


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if "x" not in data or "y" not in data:
                raise ConfigError(f"{path} must hold arrays `x` and `y`; it has {sorted(data)}")
            x, y = np.asarray(data["x"], np.float32), np.asarray(data["y"])
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path} as .npz: {exc}") from None
    if y.dtype.kind not in "iu" or y.ndim != 1 or len(x) != len(y):
        raise ConfigError(
            f"{path}: `y` must be integer labels, one per sample of `x`; got {y.dtype} "
            f"{list(y.shape)} for x {list(x.shape)}"
        )
    return x, y.astype(np.int64)


def _join(
    parts: list[tuple[np.ndarray, np.ndarray]], folder: Path
) -> tuple[np.ndarray, np.ndarray]:
    """Samples of several files in one array, in the first file's layout (files whose
    samples hold the same number of values, e.g. flat rows, are reshaped to it)."""
    shape = parts[0][0].shape[1:]
    size = int(np.prod(shape))
    xs = []
    for x, _ in parts:
        if x.shape[1:] != shape:
            if int(np.prod(x.shape[1:])) != size:
                raise ConfigError(
                    f"{str(folder)!r}: samples of shape {list(x.shape[1:])} and "
                    f"{list(shape)} in one folder; every file's x must hold the same layout"
                )
            x = x.reshape(len(x), *shape)
        xs.append(x)
    return np.concatenate(xs), np.concatenate([y for _, y in parts])


def load_data_dir(
    folder: Path,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((x, y) to train on, (x, y) to evaluate on) from the .npz files in `folder`."""
    if not folder.is_dir():
        raise ConfigError(f"--data must be a folder of .npz files, {str(folder)!r} is not one")
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise ConfigError(f"{str(folder)!r} holds no .npz files (each with arrays x and y)")
    train = [_read(f) for f in files if not f.name.startswith("eval")]
    held = [_read(f) for f in files if f.name.startswith("eval")]
    if not train:
        raise ConfigError(f"{str(folder)!r} holds only evaluation files (eval*.npz)")
    x, y = _join(train, folder)
    if held:
        return (x, y), _join(held, folder)
    out = np.arange(len(y)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    if out.all() or not out.any():
        return (x, y), (x, y)
    return (x[~out], y[~out]), (x[out], y[out])
