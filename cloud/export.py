"""export(model, "model.spore"): the inference IR of a cloud model, ready for any device.

The exported graph is the model in eval mode: BatchNorm uses its running statistics and is
folded into the convolution before it where it can be, Dropout is gone, and whatever
preprocessing the model does (e.g. a Rescale layer) is inside the graph. The first output
is "logits", the second "probabilities" (softmax). Labels and a description of the
expected input go into the metadata.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.cloud.errors import ExportError
from sporenet.cloud.module import Module
from sporenet.cloud.trace import INPUT_NAME, trace
from sporenet.converter.passes import fold_batch_norms
from sporenet.converter.passes.graph_utils import compact_tensors
from sporenet.lite.errors import LiteError
from sporenet.lite.format import save
from sporenet.lite.graph import Model
from sporenet.lite.validate import validate


def export(
    model: Module,
    path: str | os.PathLike,
    *,
    input_shape: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    input_range: tuple[float, float] | None = None,
    probabilities: bool = True,
    fold_batch_norm: bool = True,
    metadata: dict[str, str] | None = None,
    sparsify: bool = False,
) -> Model:
    """Write the inference model to `path` and return it.

    `input_shape` is one sample's shape, e.g. (1, 8, 8); it defaults to the shape `fit`
    recorded on the model. `input_range` documents the raw input values the graph expects.
    `sparsify` stores pruned weights in the sparse BITMASK layout where that saves space
    (lite/sparse.py); the runtime expands them at load.
    """
    ir = to_inference_ir(
        model,
        input_shape=input_shape,
        labels=labels,
        input_range=input_range,
        probabilities=probabilities,
        fold_batch_norm=fold_batch_norm,
        metadata=metadata,
    )
    if sparsify:
        _positive_zeros(ir)
    try:
        save(ir, Path(path), sparsify=sparsify)
    except LiteError as exc:
        raise ExportError(f"could not write {os.fspath(path)!r}: {exc}") from exc
    return ir


def _positive_zeros(ir: Model) -> None:
    """Turn -0.0 weights into +0.0 (numerically the same): a pruned weight times a
    negative BatchNorm scale is -0.0, which the sparse layout would store as a value."""
    for t in ir.tensors:
        if t.data is not None and t.data.dtype.kind == "f":
            t.data = np.asarray(t.data + t.data.dtype.type(0.0))


def to_inference_ir(
    model: Module,
    *,
    input_shape: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    input_range: tuple[float, float] | None = None,
    probabilities: bool = True,
    fold_batch_norm: bool = True,
    metadata: dict[str, str] | None = None,
) -> Model:
    """The exported IR in memory (what `export` writes)."""
    shape = input_shape if input_shape is not None else getattr(model, "input_shape", None)
    if shape is None:
        raise ExportError(
            "`input_shape` (one sample's shape, e.g. (1, 8, 8)) is required: the model has "
            "not been trained with fit, which records it"
        )
    try:
        ir = trace(model, shape, training=False, softmax_output=probabilities)
    except LiteError as exc:
        raise ExportError(f"could not trace the model for export: {exc}") from exc
    rename = export_names(model)
    for t in ir.tensors:
        t.name = rename.get(t.name, t.name)
    if fold_batch_norm:
        # The converter's pass: it keeps the folded parameters' names; the BatchNorm
        # parameters it leaves unread are dropped.
        fold_batch_norms(ir)
        compact_tensors(ir)
    ir.description = f"{type(model).__name__} exported by sporenet.cloud"
    info: dict[str, Any] = {
        "name": INPUT_NAME,
        "shape": [-1, *(int(d) for d in shape)],
        "dtype": "float32",
        "preprocessing": "inside the graph",
    }
    if input_range is not None:
        info["range"] = [float(input_range[0]), float(input_range[1])]
    ir.metadata["input"] = json.dumps(info)
    ir.metadata["outputs"] = json.dumps(list(ir.signature("infer").outputs))
    if labels is not None:
        ir.metadata["labels"] = json.dumps([str(v) for v in labels])
    ir.metadata.update(metadata or {})
    validate(ir)
    return ir


def export_names(model: Module) -> dict[str, str]:
    """State path -> exported tensor name: a layer named only by its position in a
    Sequential ("14.weight") is named after its type and position ("dense14.weight"), so an
    exported file's trainable names say what they are; named layers keep their names."""
    names = {}
    for path, _ in model.named_state():
        parts = path.split(".")
        module, out = model, []
        for part in parts[:-1]:
            module = getattr(module, part)
            out.append(f"{type(module).__name__.lower()}{part}" if part.isdigit() else part)
        names[path] = ".".join([*out, parts[-1]])
    return names
