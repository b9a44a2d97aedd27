"""The two training engines behind fit: eager (tape + run_op) and graph (trace + Trainer).

Both differentiate with lite's `append_gradients` and update with lite's optimizer ops, so
for the same seed and data they compute the same numbers (Dropout masks excepted: each
mode draws them from its own generator); they differ in when the work is planned. The
eager engine records each step on a fresh tape, runs every op at once, then appends the
backward nodes to that tape and runs them one by one. The graph engine traces the model
once, lets `make_training_model` add loss, backward and update nodes, and runs the
planned graph with lite's `Trainer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from sporenet.cloud.errors import TraceError
from sporenet.cloud.module import Module, Parameter, run_eager, training_mode
from sporenet.cloud.optimizers import SGD, Optimizer
from sporenet.cloud.tape import Tape, Var
from sporenet.lite.eager import run_op
from sporenet.lite.errors import LiteError
from sporenet.lite.kernels.control_flow import SUBGRAPH_ATTRIBUTES
from sporenet.lite.ops import OpCode
from sporenet.lite.threads import BLAS

LABELS_NAME = "labels"


class Engine(Protocol):
    """What fit needs from an engine."""

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One optimizer step on a batch; returns the batch loss."""

    def predict(self, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """Eval-mode outputs with the current weights."""

    def sync(self) -> None:
        """Make the module's parameters and the Optimizer's slots current."""

    def parameter(self, name: str) -> np.ndarray:
        """The live array of trainable parameter `name` (written in place, read next step)."""

    def close(self) -> None:
        """Sync and release resources at the end of fit."""


def loss_node(tape: Tape, loss: str, outputs: Var, labels: Var, label_smoothing: float) -> Var:
    """Record the loss op on a tape (the same op lite's training graph uses)."""
    if loss == "softmax_cross_entropy":
        value, _probs = tape.op(
            OpCode.SOFTMAX_CROSS_ENTROPY,
            [outputs, labels],
            num_outputs=2,
            label_smoothing=float(label_smoothing),
        )
        return value
    op = OpCode.MSE_LOSS if loss == "mse" else OpCode.BCE_WITH_LOGITS
    return tape.op(op, [outputs, labels])


class Slots:
    """Optimizer slots of one parameter, stored in the Optimizer's state by name."""

    def __init__(self, optimizer: Optimizer, name: str, param: Parameter) -> None:
        slots = optimizer.state.slots
        self.arrays: list[np.ndarray] = []
        # Names and dtypes as lite's make_training_model gives the train graph's slots, so
        # the state moves between the modes and into checkpoints unchanged.
        if isinstance(optimizer, SGD):
            if optimizer.momentum:
                self.arrays.append(slots.setdefault(f"{name}/momentum", np.zeros_like(param.value)))
        else:
            self.arrays.append(slots.setdefault(f"{name}/adam_m", np.zeros_like(param.value)))
            self.arrays.append(slots.setdefault(f"{name}/adam_v", np.zeros_like(param.value)))
            self.arrays.append(slots.setdefault(f"{name}/adam_step", np.zeros((), np.int64)))


def update_attrs(optimizer: Optimizer) -> dict[str, Any]:
    h = optimizer.hyperparameters()
    if optimizer.kind == "sgd":
        return {
            "momentum": h["momentum"],
            "nesterov": int(h["nesterov"]),
            "weight_decay": h["weight_decay"],
        }
    return {
        "beta1": h["betas"][0],
        "beta2": h["betas"][1],
        "eps": h["eps"],
        "weight_decay": h["weight_decay"],
        "decoupled": int(optimizer.kind == "adamw"),
    }


class EagerEngine:
    """One fresh tape per step: forward ops run at once, backward nodes appended and run."""

    def __init__(
        self,
        model: Module,
        *,
        loss: str,
        optimizer: Optimizer,
        label_smoothing: float,
        num_threads: int | None = None,
    ) -> None:
        self.model = model
        self.num_threads = num_threads
        self.loss = loss
        self.optimizer = optimizer
        self.label_smoothing = label_smoothing
        self.names = model.state_names()
        self.trainable = list(model.named_parameters())
        self.op = OpCode.SGD_UPDATE if optimizer.kind == "sgd" else OpCode.ADAM_UPDATE
        self.attrs = update_attrs(optimizer)
        self.last_tape: Tape | None = None

    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        """Loss and gradients of every trainable parameter for one batch (no update)."""
        tape = Tape(eager=True, training=True, names=self.names)
        tape.step = self.optimizer.state.step
        out = self.model(tape.input("input", x))
        labels = tape.input(LABELS_NAME, y)
        loss = loss_node(tape, self.loss, out, labels, self.label_smoothing)
        ir = tape.model([(loss, "loss")])
        used = [(name, p) for name, p in self.trainable if id(p) in tape.params]
        graph = ir.graphs[0]
        first_backward = len(graph.nodes)
        try:
            grads = _append_gradients(ir, loss.index, [tape.params[id(p)] for _, p in used])
        except LiteError as exc:
            raise TraceError(f"cannot differentiate the model: {exc}") from exc
        values = tape.values
        for node in graph.nodes[first_backward:]:
            ins = [
                None if i == -1 else values[i] if i in values else ir.tensors[i].data
                for i in node.inputs
            ]
            # Subgraph ops (custom gradients) plan their subgraphs from the step's model.
            model = ir if node.op in SUBGRAPH_ATTRIBUTES else None
            attrs: dict[str, Any] = node.attrs  # the kernel's attributes, by name
            outs = run_op(node.op, ins, num_outputs=len(node.outputs), model=model, **attrs)
            values.update(zip(node.outputs, outs, strict=True))
        self.last_tape = tape
        result = {name: values[grads[tape.params[id(p)]]] for name, p in used}
        return float(values[loss.index]), result

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        with BLAS.limit(self.num_threads):  # None: the runtime's default count
            return self._step(x, y, lr)

    def _step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        value, grads = self.gradients(x, y)
        rate = np.array(lr, np.float32)
        for name, p in self.trainable:
            if name not in grads:
                continue  # not on this forward's path (a branch the model skipped)
            slots = Slots(self.optimizer, name, p).arrays
            grad = np.ascontiguousarray(grads[name], dtype=np.float32).reshape(p.value.shape)
            run_op(self.op, [p.value, grad, rate, *slots], **self.attrs)
        self.optimizer.state.step += 1
        return value

    def predict(self, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """Eval-mode outputs, run eagerly."""
        with training_mode(self.model, False):
            return np.concatenate(
                [run_eager(self.model, x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
            )

    def parameter(self, name: str) -> np.ndarray:
        """The parameter's own array: eager steps update it in place."""
        return dict(self.trainable)[name].value

    def sync(self) -> None:
        """Nothing to do: parameters and slots are updated in place."""

    def close(self) -> None:
        self.last_tape = None


def _append_gradients(ir: Any, loss: int, wrt: Sequence[int]) -> dict[int, int]:
    from sporenet.lite.autodiff import append_gradients

    return append_gradients(ir, 0, loss, list(wrt))


def make_engine(
    mode: str,
    model: Module,
    *,
    sample_shape: Sequence[int],
    loss: str,
    optimizer: Optimizer,
    label_smoothing: float,
    num_threads: int | None,
) -> Engine:
    """The engine for `mode` ("eager" or "graph")."""
    if mode == "eager":
        return EagerEngine(
            model,
            loss=loss,
            optimizer=optimizer,
            label_smoothing=label_smoothing,
            num_threads=num_threads,
        )
    from sporenet.cloud.graph_engine import GraphEngine

    return GraphEngine(
        model,
        sample_shape=sample_shape,
        loss=loss,
        optimizer=optimizer,
        label_smoothing=label_smoothing,
        num_threads=num_threads,
    )
