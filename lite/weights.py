"""Reading and replacing a model's weights by name: what federated clients and servers exchange."""

from __future__ import annotations

import dataclasses

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.format import Source, load, serialize
from sporenet.lite.graph import Model


def read_weights(source: Source | Model, *, trainable_only: bool = False) -> dict[str, np.ndarray]:
    """Float constant tensors of a model by name, in tensor-table order (read-only views).

    With `trainable_only`, only tensors flagged trainable are returned; a model with no
    trainable flags at all returns every float constant (all of it is trainable).
    """
    model = load(source)
    floats = [t for t in model.tensors if t.data is not None and t.dtype.kind == "f"]
    if trainable_only and any(t.trainable for t in floats):
        floats = [t for t in floats if t.trainable]
    return {t.name: t.data for t in floats}  # type: ignore[misc]


def replace_weights(source: Source | Model, weights: dict[str, np.ndarray]) -> Model:
    """A copy of the model whose named constant tensors hold `weights` (names, shapes and
    dtypes must match the existing tensors exactly)."""
    model = load(source)
    by_name = {t.name: i for i, t in enumerate(model.tensors) if t.data is not None}
    unknown = sorted(set(weights) - set(by_name))
    if unknown:
        raise InputError(f"unknown weight tensors {unknown}; the model has {sorted(by_name)}")
    tensors = list(model.tensors)
    for name, value in weights.items():
        old = tensors[by_name[name]]
        value = np.asarray(value)
        if value.shape != tuple(old.shape) or value.dtype != old.dtype:
            raise InputError(
                f"weight {name!r}: expected {old.dtype}{list(old.shape)}, got "
                f"{value.dtype}{list(value.shape)}"
            )
        tensors[by_name[name]] = dataclasses.replace(old, data=value)
    return dataclasses.replace(model, tensors=tensors)


def replace_weights_bytes(source: Source | Model, weights: dict[str, np.ndarray]) -> bytes:
    """The .spore bytes of `replace_weights(source, weights)`."""
    return serialize(replace_weights(source, weights))
