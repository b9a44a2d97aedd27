"""What every data-parallel worker runs: graph mode's train graph split at its updates.

`gradient_model` traces the module and builds the train graph that fit's graph mode
runs (lite's `make_training_model`), then cuts it in two signatures of one model:
"gradients" (forward, loss and backward: the train graph without its update nodes, the
gradient of every parameter an output) and "update" (those update nodes, reading the
summed gradients and the learning rate). So a shard's gradients come from the same
kernels and fusions as one process's step, and the update is the same nodes.

A `Replica` plans "gradients" once per shard size over parameter arrays it is handed
(shared memory in the local backend) and writes the gradients scaled by the shard's
share of the combined batch, so the all-reduce is a plain sum. An `Updater` plans
"update" once over the state arrays; `apply` sums the workers' rows in worker order into
the plan's gradient inputs and runs it. Both are the same in every backend, so the local
and Ray backends compute the same numbers in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sporenet.cloud.errors import ConfigError
from sporenet.cloud.graph_engine import train_graph
from sporenet.cloud.module import Module
from sporenet.cloud.optimizers import Optimizer
from sporenet.cloud.trace import INPUT_NAME
from sporenet.lite.graph import Graph, Model, Signature
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_set
from sporenet.lite.planner import plan
from sporenet.lite.threads import BLAS

# Ops whose training behaviour depends on the batch they see (statistics, random masks):
# per-shard results would differ from one process's, so data parallelism refuses them.
BATCH_DEPENDENT = derived_set(lambda d: d.batch_dependent)
UPDATE_OPS = (OpCode.SGD_UPDATE, OpCode.ADAM_UPDATE)


@dataclass(frozen=True)
class GradientModel:
    """The split train graph and where its state, inputs and outputs are."""

    model: Model  # signatures "gradients" and "update"
    params: list[tuple[str, int]]  # (name, tensor index) of each trained parameter
    slots: dict[str, list[tuple[str, int]]]  # per parameter: its optimizer slots
    grads: list[int]  # gradient tensor per parameter, same order
    loss: int
    input: int
    labels: int
    lr: int

    def state(self) -> list[tuple[str, int]]:
        """Every tensor the update writes: the parameters, then their slots."""
        return [*self.params, *(s for p, _ in self.params for s in self.slots[p])]


def gradient_model(
    module: Module,
    sample_shape: Sequence[int],
    *,
    loss: str,
    optimizer: Optimizer,
    label_smoothing: float,
) -> GradientModel:
    """Graph mode's train graph for `module`, split into "gradients" and "update"."""
    m = train_graph(
        module, sample_shape, loss=loss, optimizer=optimizer, label_smoothing=label_smoothing
    )
    sig = m.signature("train")
    train = m.graphs[sig.graph]
    _refuse_batch_dependent(train)
    updates = [n for n in train.nodes if n.op in UPDATE_OPS]
    tensors = m.tensors
    params = [(tensors[n.inputs[0]].name, n.inputs[0]) for n in updates]
    grads = [n.inputs[1] for n in updates]
    loss_t, lr = sig.outputs["loss"], sig.inputs["lr"]
    x, labels = sig.inputs[INPUT_NAME], sig.inputs["labels"]
    named = {f"grad:{p}": g for (p, _), g in zip(params, grads, strict=True)}
    m.graphs.append(
        Graph(
            name="gradients",
            inputs=[x, labels],
            outputs=[loss_t, *grads],
            nodes=[n for n in train.nodes if n.op not in UPDATE_OPS],
        )
    )
    m.signatures["gradients"] = Signature(
        key="gradients",
        graph=len(m.graphs) - 1,
        inputs={INPUT_NAME: x, "labels": labels},
        outputs={"loss": loss_t, **named},
    )
    m.graphs.append(Graph(name="update", inputs=[*grads, lr], outputs=[], nodes=updates))
    m.signatures["update"] = Signature(
        key="update",
        graph=len(m.graphs) - 1,
        inputs={**named, "lr": lr},
        outputs={},
    )
    slots = {
        tensors[n.inputs[0]].name: [(tensors[i].name, i) for i in n.inputs[3:]] for n in updates
    }
    return GradientModel(m, params, slots, grads, loss_t, x, labels, lr)


def _refuse_batch_dependent(train: Graph) -> None:
    """ConfigError for a train graph whose results depend on the batch a worker sees (a
    BatchNorm left in inference form reads frozen statistics, so it does not)."""
    used = {n.op.name for n in train.nodes if n.op in BATCH_DEPENDENT and n.op != OpCode.BATCH_NORM}
    if used:
        raise ConfigError(
            f"DataParallel cannot train a model with {', '.join(sorted(used))}: each worker "
            "would see its shard's statistics or masks, so the result would not equal one "
            "process's training on the combined batch"
        )


class Replica:
    """One worker's gradient plans over parameter arrays it reads in place."""

    def __init__(self, spec: GradientModel, params: Mapping[str, np.ndarray]) -> None:
        self.spec = spec
        self.variables = {i: params[name] for name, i in spec.params}
        self.plans: dict[int, Any] = {}

    def gradients(
        self, x: np.ndarray, y: np.ndarray, share: float, out: Sequence[np.ndarray]
    ) -> float:
        """Write d(loss)/d(param) * share into `out` (one array per parameter) for the
        shard (x, y); returns the shard's mean loss."""
        spec = self.spec
        planned = self.plans.get(len(x))
        if planned is None:
            shapes = {spec.input: x.shape, spec.labels: y.shape}
            planned = plan(spec.model, "gradients", shapes=shapes, variables=self.variables)
            self.plans[len(x)] = planned
        arrays = planned.arrays
        np.copyto(arrays[spec.input], x)
        np.copyto(arrays[spec.labels], y)
        with BLAS.limit(1):  # one core per worker
            planned.run()
        for g, dst in zip(spec.grads, out, strict=True):
            np.multiply(arrays[g].reshape(dst.shape), share, out=dst)
        return float(arrays[spec.loss])


class Updater:
    """The update nodes planned once over the state arrays (parameters and slots)."""

    def __init__(self, spec: GradientModel, state: Mapping[str, np.ndarray]) -> None:
        variables = {i: state[name] for name, i in spec.state()}
        shapes = {
            g: state[name].shape for (name, _), g in zip(spec.params, spec.grads, strict=True)
        }
        self.plan = plan(spec.model, "update", shapes=shapes, variables=variables)
        self.sums = [self.plan.arrays[g] for g in spec.grads]
        self.lr = self.plan.arrays[spec.lr]

    def apply(self, rows: Sequence[Sequence[np.ndarray]], lr: float) -> None:
        """The all-reduce of the workers' scaled gradients (rows[k][p]: worker k's of
        parameter p), summed in worker order, then one update of every parameter."""
        for p, total in enumerate(self.sums):
            np.copyto(total, rows[0][p].reshape(total.shape))
            for r in rows[1:]:
                total += r[p].reshape(total.shape)
        self.lr[...] = lr
        self.plan.run()
