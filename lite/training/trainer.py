"""Trainer: runs a model's "train" graph step by step on variables it owns.

The variables are writable copies of the trained weights, the optimizer slots and the
BatchNorm running statistics. The train and infer graphs are planned once per input
shape with those arrays bound in place, so a step is one run of a planned graph and
`evaluate` sees the latest weights without re-planning.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.graph import Graph, Model, Node, Signature
from sporenet.lite.planner import ExecutionPlan, plan
from sporenet.lite.threads import BLAS
from sporenet.lite.training.model import optimizer_slots, parameters, updated_stats
from sporenet.lite.validate import validate


class Trainer:
    """Train a model made by make_training_model: step(), evaluate(), weights(), export()."""

    def __init__(self, model: Model, *, num_threads: int | None = None) -> None:
        if "train" not in model.signatures:
            raise ValueError("the model has no 'train' signature; build it with "
                             "sporenet.lite.training.make_training_model")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
        self.model = model
        self.num_threads = num_threads
        self._params = parameters(model)
        self._stats = sorted(updated_stats(model))
        slots = optimizer_slots(model)
        ids = [*self._params, *self._stats, *sorted(slots)]
        # Writable copies: the model's own arrays (possibly a read-only memory map) stay intact.
        self.variables: dict[int, np.ndarray] = {
            i: np.array(model.tensors[i].data, copy=True) for i in ids
        }
        self._plans: dict[tuple[str, tuple], ExecutionPlan] = {}
        self.steps = 0

    # ---- running
    def _feed(self, key: str, feeds: dict[str, Any]) -> ExecutionPlan:
        sig = self.model.signature(key)
        unknown = sorted(set(feeds) - set(sig.inputs))
        missing = sorted(set(sig.inputs) - set(feeds))
        if unknown or missing:
            raise InputError(f"{key} inputs expected {sorted(sig.inputs)}; unknown {unknown}, "
                             f"missing {missing}")
        arrays = {}
        for name, value in feeds.items():
            index = sig.inputs[name]
            tensor = self.model.tensors[index]
            value = np.asarray(value)
            if value.dtype != tensor.dtype:
                if not np.can_cast(value.dtype, tensor.dtype, "same_kind"):
                    raise InputError(f"input {name!r}: expected {tensor.dtype}, got {value.dtype}")
                value = value.astype(tensor.dtype)
            declared = tensor.shape
            if len(value.shape) != len(declared) or any(
                    d not in (-1, s) for d, s in zip(declared, value.shape, strict=True)):
                raise InputError(f"input {name!r}: shape {list(value.shape)} does not match "
                                 f"its signature {list(declared)} (-1: any size)")
            arrays[index] = value
        shapes = {i: a.shape for i, a in arrays.items()}
        cache = (key, tuple(sorted(shapes.items())))
        planned = self._plans.get(cache)
        if planned is None:
            planned = plan(self.model, key, shapes, variables=self.variables)
            self._plans[cache] = planned
        for i, a in arrays.items():
            np.copyto(planned.arrays[i], a)
        return planned

    def _run(self, planned: ExecutionPlan) -> None:
        with BLAS.limit(self.num_threads):
            planned.run()

    def step(self, feeds: dict[str, Any], lr: float) -> float:
        """One training step on a batch (the infer inputs plus "labels"); returns the loss."""
        if not np.isfinite(lr) or lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {lr}")
        self._check_class_ids(feeds.get("labels"))
        planned = self._feed("train", {**feeds, "lr": np.float32(lr)})
        self._run(planned)
        self.steps += 1
        return float(planned.arrays[self.model.signature("train").outputs["loss"]])

    def _check_class_ids(self, labels: Any) -> None:
        """Class ids must index the logits (NumPy would wrap negative ones silently)."""
        if labels is None:
            return
        labels = np.asarray(labels)
        sig = self.model.signature("train")
        if labels.dtype.kind not in "iu" or self.model.tensors[sig.inputs["labels"]].dtype.kind \
                not in "iu" or labels.size == 0:
            return
        classes = self.model.tensors[sig.outputs["logits"]].shape[-1]
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or (classes > 0 and hi >= classes):
            raise InputError(f"labels must be class ids in [0, {classes}), got values in "
                             f"[{lo}, {hi}]")

    def evaluate(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        """Run the infer graph (eval mode) with the current weights; outputs by name."""
        planned = self._feed("infer", feeds)
        self._run(planned)
        return {name: np.array(planned.arrays[i])
                for name, i in self.model.signature("infer").outputs.items()}

    # ---- results
    def weights(self) -> dict[str, np.ndarray]:
        """Copies of the trained weights and BatchNorm running statistics, by tensor name."""
        return {self.model.tensors[i].name: self.variables[i].copy()
                for i in [*self._params, *self._stats]}

    def export(self) -> Model:
        """The inference model (infer graph only) carrying the trained weights."""
        return strip_training(self.model, self.variables)


def strip_training(model: Model, values: dict[int, np.ndarray] | None = None) -> Model:
    """The infer graph of `model` alone, with only the tensors it uses (renumbered) and
    `values` replacing constant data."""
    values = values or {}
    sig = model.signature("infer")
    g = model.graphs[sig.graph]
    used = {*g.inputs, *g.outputs}
    for n in g.nodes:
        used.update(i for i in (*n.inputs, *n.outputs) if i != -1)
    order = sorted(used)
    new = {old: k for k, old in enumerate(order)}

    def remap(ids: list[int]) -> list[int]:
        return [new[i] if i != -1 else -1 for i in ids]

    tensors = []
    for i in order:
        t = model.tensors[i]
        if i in values:
            t = replace(t, data=np.array(values[i], copy=True))
        tensors.append(t)
    graph = Graph(name=g.name, inputs=remap(g.inputs), outputs=remap(g.outputs),
                  nodes=[Node(n.op, remap(n.inputs), remap(n.outputs), dict(n.attrs), n.version,
                              n.name) for n in g.nodes])
    infer = Signature(key="infer", graph=0, inputs={k: new[i] for k, i in sig.inputs.items()},
                      outputs={k: new[i] for k, i in sig.outputs.items()})
    metadata = {k: v for k, v in model.metadata.items() if not k.startswith("train.")}
    out = Model(tensors=tensors, graphs=[graph], signatures={"infer": infer}, metadata=metadata,
                producer=model.producer, producer_version=model.producer_version,
                description=model.description)
    return validate(out)
