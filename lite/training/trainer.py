"""Trainer: runs a model's "train" graph step by step, through an Interpreter's signature
runners.

The Interpreter owns writable copies of the state the train graph writes (the trained
weights, the optimizer slots, the BatchNorm running statistics), shared by its "train"
and "infer" runners, so a step is one run of a planned graph and `evaluate` sees the
latest weights without re-planning. A checkpoint is the training model itself (a .spore
file) with that state as its constants and the step count in its metadata: loading it
resumes bit-exactly where training stopped.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.lite.errors import InputError
from sporenet.lite.format import load, save
from sporenet.lite.graph import Graph, Model, Node, Signature
from sporenet.lite.interpreter import Interpreter
from sporenet.lite.training.config import OptimizerConfig
from sporenet.lite.training.model import optimizer_slots, parameters, updated_stats
from sporenet.lite.validate import validate

STEPS_KEY = "train.steps"
"""Metadata key of a checkpoint's step count."""


class Trainer:
    """Train a model made by make_training_model: step(), evaluate(), weights(), export(),
    save_checkpoint() and load_checkpoint()."""

    def __init__(self, model: Model, *, num_threads: int | None = None) -> None:
        if "train" not in model.signatures:
            raise ValueError(
                "the model has no 'train' signature; build it with "
                "sporenet.lite.training.make_training_model"
            )
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
        self.model = model
        self.num_threads = num_threads
        self.interpreter = Interpreter(model=model, num_threads=num_threads, signature="train")
        self._train = self.interpreter.get_signature_runner("train")
        self._infer = self.interpreter.get_signature_runner("infer")
        self._params = parameters(model)
        self._stats = sorted(updated_stats(model))
        self._slots = sorted(optimizer_slots(model))
        self.variables: dict[int, np.ndarray] = self.interpreter.variables
        self.steps = int(model.metadata.get(STEPS_KEY, 0))
        # Training models made before the rate was recorded fall back to the config's default.
        self.default_lr = float(model.metadata.get("train.lr", OptimizerConfig().lr))

    # ---- running
    def step(self, feeds: dict[str, Any], lr: float | None = None) -> float:
        """One training step on a batch (the infer inputs plus "labels"); returns the loss.
        `lr` defaults to the rate of the OptimizerConfig the model was made with."""
        if lr is None:
            lr = self.default_lr
        if not np.isfinite(lr) or lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {lr}")
        self._check_class_ids(feeds.get("labels"))
        planned = self._train.prepare({**feeds, "lr": np.float32(lr)})
        self.interpreter.execute(planned)
        self.steps += 1
        return float(self._train.output("loss"))

    def _check_class_ids(self, labels: Any) -> None:
        """Class ids must index the logits (NumPy would wrap negative ones silently)."""
        if labels is None:
            return
        labels = np.asarray(labels)
        sig = self.model.signature("train")
        if (
            labels.dtype.kind not in "iu"
            or self.model.tensors[sig.inputs["labels"]].dtype.kind not in "iu"
            or labels.size == 0
        ):
            return
        classes = self.model.tensors[sig.outputs["logits"]].shape[-1]
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or (classes > 0 and hi >= classes):
            raise InputError(
                f"labels must be class ids in [0, {classes}), got values in [{lo}, {hi}]"
            )

    def evaluate(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        """Run the infer graph (eval mode) with the current weights; outputs by name."""
        return self._infer(**feeds)

    # ---- results
    def weights(self) -> dict[str, np.ndarray]:
        """Copies of the trained weights and BatchNorm running statistics, by tensor name."""
        return {
            self.model.tensors[i].name: self.variables[i].copy()
            for i in [*self._params, *self._stats]
        }

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Overwrite state tensors by name (e.g. a federated round's global weights); names
        that are not trained by this model are ignored, shapes must match."""
        by_name = {self.model.tensors[i].name: i for i in self.variables}
        for name, value in weights.items():
            i = by_name.get(name)
            if i is None:
                continue
            value = np.asarray(value)
            if value.shape != self.variables[i].shape:
                raise InputError(
                    f"weight {name!r}: expected shape "
                    f"{list(self.variables[i].shape)}, got {list(value.shape)}"
                )
            np.copyto(self.variables[i], value, casting="same_kind")

    def reset_optimizer(self) -> None:
        """Zero the optimizer slots (momentum, Adam moments and step) and the step count:
        a fresh optimizer on the current weights (e.g. at each federated round)."""
        for i in self._slots:
            self.variables[i].fill(0)
        self.steps = 0

    def export(self) -> Model:
        """The inference model (infer graph only) carrying the trained weights."""
        return strip_training(self.model, self.variables)

    # ---- checkpoints
    def checkpoint(self) -> Model:
        """The training model with the current state (weights, optimizer slots, statistics)
        as its constants and the step count in its metadata."""
        tensors = list(self.model.tensors)
        for i, value in self.variables.items():
            tensors[i] = replace(tensors[i], data=value.copy())
        return replace(
            self.model,
            tensors=tensors,
            metadata={**self.model.metadata, STEPS_KEY: str(self.steps)},
        )

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write checkpoint() to `path` (a .spore file any Trainer can resume from)."""
        save(self.checkpoint(), Path(path))

    def load_checkpoint(self, path: str | os.PathLike | Model) -> None:
        """Resume from a checkpoint of the same training model: its state and step count.

        The checkpoint's state tensors must match this model's by name, shape and dtype.
        """
        saved = path if isinstance(path, Model) else load(Path(path))
        by_name = {t.name: t for t in saved.tensors}
        problems = []
        for i, value in self.variables.items():
            name = self.model.tensors[i].name
            t = by_name.get(name)
            if t is None or t.data is None:
                problems.append(f"{name!r} missing")
            elif t.data.shape != value.shape or t.data.dtype != value.dtype:
                problems.append(
                    f"{name!r}: expected {value.dtype}{list(value.shape)}, got "
                    f"{t.data.dtype}{list(t.data.shape)}"
                )
        if problems:
            raise InputError(
                "the checkpoint does not match this training model: " + "; ".join(problems)
            )
        for i, value in self.variables.items():
            np.copyto(value, np.asarray(by_name[self.model.tensors[i].name].data))
        self.steps = int(saved.metadata.get(STEPS_KEY, 0))


def strip_training(model: Model, values: dict[int, np.ndarray] | None = None) -> Model:
    """The infer graph of `model` alone, with the subgraphs its control-flow and CALL
    nodes name (renumbered from 1), only the tensors they use (renumbered) and `values`
    replacing constant data."""
    from sporenet.lite.kernels.control_flow import SUBGRAPH_ATTRIBUTES

    values = values or {}
    sig = model.signature("infer")
    reached = [sig.graph]  # the infer graph first, then the subgraphs it reaches
    for gi in reached:
        for n in model.graphs[gi].nodes:
            for attr in SUBGRAPH_ATTRIBUTES.get(n.op, ()):
                sub = int(n.attrs.get(attr, -1))  # type: ignore[arg-type]
                if sub != -1 and sub not in reached:
                    reached.append(sub)
    graph_index = {old: k for k, old in enumerate(reached)}
    used: set[int] = set()
    for gi in reached:
        g = model.graphs[gi]
        used.update(g.inputs, g.outputs)
        for n in g.nodes:
            used.update(i for i in (*n.inputs, *n.outputs) if i != -1)
    order = sorted(used)
    new = {old: k for k, old in enumerate(order)}

    def remap(ids: list[int]) -> list[int]:
        return [new[i] if i != -1 else -1 for i in ids]

    def attrs(n: Node) -> dict:
        out = dict(n.attrs)
        for attr in SUBGRAPH_ATTRIBUTES.get(n.op, ()):
            if int(out.get(attr, -1)) != -1:  # type: ignore[arg-type]
                out[attr] = graph_index[int(out[attr])]  # type: ignore[arg-type]
        return out

    tensors = []
    for i in order:
        t = model.tensors[i]
        if i in values:
            t = replace(t, data=np.array(values[i], copy=True))
        tensors.append(t)
    graphs = [
        Graph(
            name=model.graphs[gi].name,
            inputs=remap(model.graphs[gi].inputs),
            outputs=remap(model.graphs[gi].outputs),
            nodes=[
                Node(n.op, remap(n.inputs), remap(n.outputs), attrs(n), n.version, n.name)
                for n in model.graphs[gi].nodes
            ],
        )
        for gi in reached
    ]
    infer = Signature(
        key="infer",
        graph=0,
        inputs={k: new[i] for k, i in sig.inputs.items()},
        outputs={k: new[i] for k, i in sig.outputs.items()},
    )
    metadata = {k: v for k, v in model.metadata.items() if not k.startswith("train.")}
    out = Model(
        tensors=tensors,
        graphs=graphs,
        signatures={"infer": infer},
        metadata=metadata,
        producer=model.producer,
        producer_version=model.producer_version,
        description=model.description,
    )
    return validate(out)
