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
from sporenet.lite.errors import LiteError
from sporenet.lite.format import save
from sporenet.lite.graph import Model, Tensor
from sporenet.lite.ops import OpCode
from sporenet.lite.validate import validate


def export(model: Module, path: str | os.PathLike, *, input_shape: Sequence[int] | None = None,
           labels: Sequence[str] | None = None, input_range: tuple[float, float] | None = None,
           probabilities: bool = True, fold_batch_norm: bool = True,
           metadata: dict[str, str] | None = None, sparsify: bool = False) -> Model:
    """Write the inference model to `path` and return it.

    `input_shape` is one sample's shape, e.g. (1, 8, 8); it defaults to the shape `fit`
    recorded on the model. `input_range` documents the raw input values the graph expects.
    `sparsify` stores pruned weights in the sparse BITMASK layout where that saves space
    (lite/sparse.py); the runtime expands them at load.
    """
    ir = inference_model(model, input_shape=input_shape, labels=labels,
                         input_range=input_range, probabilities=probabilities,
                         fold_batch_norm=fold_batch_norm, metadata=metadata)
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


def inference_model(model: Module, *, input_shape: Sequence[int] | None = None,
                    labels: Sequence[str] | None = None,
                    input_range: tuple[float, float] | None = None, probabilities: bool = True,
                    fold_batch_norm: bool = True,
                    metadata: dict[str, str] | None = None) -> Model:
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
    if fold_batch_norm:
        fold_batch_norms(ir)
    ir.description = f"{type(model).__name__} exported by sporenet.cloud"
    info: dict[str, Any] = {"name": INPUT_NAME, "shape": [-1, *(int(d) for d in shape)],
                            "dtype": "float32", "preprocessing": "inside the graph"}
    if input_range is not None:
        info["range"] = [float(input_range[0]), float(input_range[1])]
    ir.metadata["input"] = json.dumps(info)
    ir.metadata["outputs"] = json.dumps(list(ir.signature("infer").outputs))
    if labels is not None:
        ir.metadata["labels"] = json.dumps([str(v) for v in labels])
    ir.metadata.update(metadata or {})
    validate(ir)
    return ir


def fold_batch_norms(model: Model, graph_index: int = 0) -> int:
    """Fold every inference BatchNorm that directly follows a Conv2D (whose output nothing
    else reads) into the convolution's weights and bias; returns how many were folded."""
    graph = model.graphs[graph_index]
    readers: dict[int, int] = {}
    for node in graph.nodes:
        for i in node.inputs:
            readers[i] = readers.get(i, 0) + 1
    producer = {o: node for node in graph.nodes for o in node.outputs}
    removed: list[int] = []
    for k, bn in enumerate(graph.nodes):
        if bn.op != OpCode.BATCH_NORM:
            continue
        conv = producer.get(bn.inputs[0])
        if (conv is None or conv.op != OpCode.CONV2D or readers.get(conv.outputs[0]) != 1
                or conv.outputs[0] in graph.outputs
                or conv.attrs.get("activation", "none") != "none"):
            continue
        tensors = model.tensors
        try:
            gamma, beta, mean, var = (tensors[i].data for i in bn.inputs[1:5])
        except (IndexError, ValueError):
            continue
        w = tensors[conv.inputs[1]]
        if any(a is None for a in (gamma, beta, mean, var, w.data)):
            continue
        eps = float(bn.attrs.get("epsilon", 1e-5))
        scale = (gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps))
        weight = (w.data.astype(np.float64) * scale[:, None, None, None]).astype(np.float32)
        has_bias = len(conv.inputs) > 2 and conv.inputs[2] != -1
        bias0 = tensors[conv.inputs[2]].data.astype(np.float64) if has_bias else 0.0
        bias = ((bias0 - mean) * scale + beta).astype(np.float32)
        tensors[conv.inputs[1]].data = weight
        if has_bias:
            tensors[conv.inputs[2]].data = bias
        else:
            tensors.append(Tensor(name=f"{w.name}.folded_bias", dtype=np.dtype(np.float32),
                                  shape=bias.shape, data=bias))
            conv.inputs = [*conv.inputs[:2], len(tensors) - 1]
        # The convolution now writes the BatchNorm's output tensor directly.
        conv.outputs = [bn.outputs[0]]
        removed.append(k)
    graph.nodes = [n for k, n in enumerate(graph.nodes) if k not in set(removed)]
    _drop_unused_constants(model)
    return len(removed)


def _drop_unused_constants(model: Model) -> None:
    """Remove tensors nothing refers to any more (folded BatchNorm parameters), reindexing."""
    used = {i for g in model.graphs for n in g.nodes for i in (*n.inputs, *n.outputs)}
    used |= {i for g in model.graphs for i in (*g.inputs, *g.outputs)}
    keep = [i for i in range(len(model.tensors)) if i in used]
    remap = {old: new for new, old in enumerate(keep)}
    remap[-1] = -1
    model.tensors = [model.tensors[i] for i in keep]
    for g in model.graphs:
        g.inputs = [remap[i] for i in g.inputs]
        g.outputs = [remap[i] for i in g.outputs]
        for n in g.nodes:
            n.inputs = [remap[i] for i in n.inputs]
            n.outputs = [remap[i] for i in n.outputs]
    for s in model.signatures.values():
        s.inputs = {k: remap[i] for k, i in s.inputs.items()}
        s.outputs = {k: remap[i] for k, i in s.outputs.items()}
