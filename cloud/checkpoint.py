"""Checkpoints: weights, buffers, optimizer slots and the epoch, in one .npz file.

Layout: "state/<param path>" for parameters and buffers, "optimizer/<slot>" for optimizer
slots, and "meta" holding JSON (format version, epoch, optimizer description and step
count, anything extra). Loading never unpickles.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.cloud.errors import CheckpointError
from sporenet.cloud.module import Module
from sporenet.cloud.optimizers import Optimizer, OptimizerState

FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    """What a checkpoint file holds."""

    state: dict[str, np.ndarray]
    optimizer_state: OptimizerState
    epoch: int
    optimizer: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(
    path: str | os.PathLike,
    model: Module,
    *,
    optimizer: Optimizer | None = None,
    epoch: int = 0,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write model state, optimizer state and `epoch` (epochs completed) to `path`."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {f"state/{k}": v for k, v in model.state_dict().items()}
    meta: dict[str, Any] = {"format": FORMAT_VERSION, "epoch": int(epoch), "extra": extra or {}}
    if optimizer is not None:
        arrays.update({f"optimizer/{k}": v for k, v in optimizer.state.slots.items()})
        meta["optimizer"] = optimizer.describe()
        meta["optimizer_step"] = int(optimizer.state.step)
    arrays["meta"] = np.array(json.dumps(meta))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Parse a checkpoint file (CheckpointError if missing or malformed)."""
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            files = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {os.fspath(path)!r}") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(f"{os.fspath(path)!r} is not a readable checkpoint: {exc}") from None
    if "meta" not in files:
        raise CheckpointError(f"{os.fspath(path)!r} has no 'meta' entry")
    try:
        meta = json.loads(str(files.pop("meta")))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{os.fspath(path)!r}: unreadable metadata ({exc})") from None
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{os.fspath(path)!r}: checkpoint format {meta.get('format')!r}, expected "
            f"{FORMAT_VERSION}"
        )
    state = {k[len("state/") :]: v for k, v in files.items() if k.startswith("state/")}
    slots = {k[len("optimizer/") :]: v for k, v in files.items() if k.startswith("optimizer/")}
    return Checkpoint(
        state=state,
        optimizer_state=OptimizerState(slots=slots, step=int(meta.get("optimizer_step", 0))),
        epoch=int(meta.get("epoch", 0)),
        optimizer=meta.get("optimizer", {}),
        extra=meta.get("extra", {}),
    )


def load_checkpoint(
    path: str | os.PathLike, model: Module, *, optimizer: Optimizer | None = None
) -> Checkpoint:
    """Restore `model` (and `optimizer`'s slots) from `path`; returns the checkpoint, whose
    `epoch` is the number of epochs completed (pass it to fit as `initial_epoch`)."""
    ckpt = read_checkpoint(path)
    model.load_state_dict(ckpt.state)
    if optimizer is not None:
        if ckpt.optimizer and ckpt.optimizer.get("kind") != optimizer.kind:
            raise CheckpointError(
                f"checkpoint optimizer is {ckpt.optimizer.get('kind')!r}, given {optimizer.kind!r}"
            )
        optimizer.state = OptimizerState(
            slots={k: v.copy() for k, v in ckpt.optimizer_state.slots.items()},
            step=ckpt.optimizer_state.step,
        )
    return ckpt
