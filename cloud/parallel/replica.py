"""What every data-parallel worker runs: the gradient graph of one shard, and the update.

`gradient_model` traces the module into one IR graph computing the loss and every
trainable parameter's gradient (lite's autodiff engine, as fit's graph mode). A `Replica`
plans it once per shard size, reading the parameters from arrays it is handed (shared
memory in the local backend), and returns the gradients scaled by the shard's share of
the combined batch, so the all-reduce is a plain sum. `combine` and `apply_update` are
the same functions in every backend, so the local and Ray backends compute the same
numbers in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sporenet.cloud.engines import loss_node
from sporenet.cloud.errors import ConfigError, TraceError
from sporenet.cloud.module import Module, training_mode
from sporenet.cloud.tape import Tape, Var, batch_shape
from sporenet.lite.autodiff import append_gradients
from sporenet.lite.eager import run_op
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_set
from sporenet.lite.planner import plan
from sporenet.lite.threads import BLAS

# Ops whose training behaviour depends on the batch they see (statistics, random masks):
# per-shard results would differ from one process's, so data parallelism refuses them.
BATCH_DEPENDENT = derived_set(lambda d: d.batch_dependent)


@dataclass(frozen=True)
class GradientModel:
    """The gradient graph and where its parameters, inputs and outputs are."""

    model: Model
    params: list[tuple[str, int, tuple[int, ...]]]  # (name, tensor index, shape)
    grads: list[int]  # gradient tensor per parameter, same order
    loss: int
    input: int
    labels: int


def gradient_model(
    module: Module, sample_shape: Sequence[int], *, loss: str, label_smoothing: float
) -> GradientModel:
    """Trace `module` in training mode with its loss and the gradients of every trainable
    parameter it reads."""
    with training_mode(module, True):
        tape = Tape(eager=False, training=True, names=module.state_names())
        x = tape.input("input", shape=batch_shape(sample_shape))
        out = module(x)
        if not isinstance(out, Var):
            raise TraceError(f"{type(module).__name__}.forward must return a Var")
        if loss == "softmax_cross_entropy":
            labels = tape.input("labels", shape=(-1,), dtype=np.int64)
        else:
            shape, _ = tape.spec(out)
            labels = tape.input("labels", shape=shape, dtype=np.float32)
        value = loss_node(tape, loss, out, labels, label_smoothing)
    used = [op.name for op in {n.op for n in tape.builder.nodes} & BATCH_DEPENDENT]
    if used:
        raise ConfigError(
            f"DataParallel cannot train a model with {', '.join(sorted(used))}: each worker "
            "would see its shard's statistics or masks, so the result would not equal one "
            "process's training on the combined batch"
        )
    params = [
        (name, tape.params[id(p)], tuple(p.value.shape))
        for name, p in module.named_parameters()
        if id(p) in tape.params
    ]
    if not params:
        raise TraceError("the model has no trainable parameters on its forward path")
    live = tape.live_model()
    try:
        found = append_gradients(live, 0, value.index, [i for _, i, _ in params])
    except LiteError as exc:
        raise TraceError(f"cannot differentiate the model: {exc}") from exc
    tape.adopt(live)
    outputs = [(value, "loss")]
    for name, i, _ in params:
        outputs.append((Var(tape, found[i], None), f"grad:{name}"))
    model = tape.model(outputs)
    for t in model.tensors:  # decouple from the live parameter arrays
        if t.data is not None:
            t.data = t.data.copy()
    return GradientModel(
        model=model,
        params=params,
        grads=[found[i] for _, i, _ in params],
        loss=value.index,
        input=x.index,
        labels=labels.index,
    )


class Replica:
    """One worker's gradient plans over parameter arrays it reads in place."""

    def __init__(self, spec: GradientModel, params: Sequence[np.ndarray]) -> None:
        self.spec = spec
        self.variables = {i: p for (_, i, _), p in zip(spec.params, params, strict=True)}
        self.plans: dict[int, Any] = {}

    def gradients(
        self, x: np.ndarray, y: np.ndarray, share: float | np.float32, out: Sequence[np.ndarray]
    ) -> float:
        """Write d(loss)/d(param) * share into `out` (one array per parameter) for the
        shard (x, y); returns the shard's mean loss."""
        n = len(x)
        if n not in self.plans:
            spec = self.spec
            shapes = {spec.input: x.shape, spec.labels: y.shape}
            self.plans[n] = plan(spec.model, "infer", shapes=shapes, variables=self.variables)
        planned = self.plans[n]
        np.copyto(planned.arrays[self.spec.input], x)
        np.copyto(planned.arrays[self.spec.labels], y)
        with BLAS.limit(1):  # one core per worker
            planned.run()
        scale = np.float32(share)
        for g, dst in zip(self.spec.grads, out, strict=True):
            np.multiply(planned.arrays[g].reshape(dst.shape), scale, out=dst)
        return float(planned.arrays[self.spec.loss])


def combine(rows: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
    """The all-reduce of the workers' scaled gradients: summed in worker order (into
    `out` when given, a buffer reused every step)."""
    if out is None:
        total = np.array(rows[0], copy=True)
    else:
        total = out
        np.copyto(total, rows[0])
    for r in rows[1:]:
        total += r
    return total


@dataclass(frozen=True)
class Update:
    """The optimizer's update op and attributes (the ones fit's engines run)."""

    op: OpCode
    attrs: dict[str, Any]

    def apply(
        self, param: np.ndarray, grad: np.ndarray, lr: float, slots: list[np.ndarray]
    ) -> None:
        run_op(self.op, [param, grad, np.array(lr, np.float32), *slots], **self.attrs)
