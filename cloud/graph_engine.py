"""Graph mode: trace once, let lite build the train graph, run it with lite's Trainer.

The model is traced in its inference form (BatchNorm with running statistics, Dropout
nodes kept in inference mode); `make_training_model` switches those to training mode and
adds the loss, the backward nodes from `append_gradients` and the optimizer updates. The
Trainer owns writable copies of weights, running statistics and optimizer slots; `sync`
copies them back into the module and the Optimizer (fit calls it after every epoch).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.cloud.errors import TraceError
from sporenet.cloud.module import Module
from sporenet.cloud.optimizers import Optimizer
from sporenet.cloud.trace import INPUT_NAME, LOGITS_NAME, trace
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import Model
from sporenet.lite.training import Trainer, make_training_model
from sporenet.lite.training.model import optimizer_slots


def train_graph(
    model: Module,
    sample_shape: Sequence[int],
    *,
    loss: str,
    optimizer: Optimizer,
    label_smoothing: float,
) -> Model:
    """The module traced and given lite's "train" graph (loss, backward, updates) for
    every parameter its forward pass reads: what graph mode runs (and data parallelism
    splits at its updates)."""
    ir = trace(model, sample_shape, training=False, keep_dropout=True)
    names = {t.name for t in ir.tensors}
    # Parameters the forward pass never reads are not in the graph.
    trainable = {name for name, _ in model.named_parameters()} & names
    if not trainable:
        raise TraceError("the model has no trainable parameters on its forward path")
    try:
        return make_training_model(
            ir,
            output=LOGITS_NAME,
            loss=loss,
            optimizer=optimizer.to_config(),
            label_smoothing=label_smoothing,
            trainable=trainable,
        )
    except (LiteError, ValueError) as exc:
        raise TraceError(f"cannot build the training graph: {exc}") from exc


class GraphEngine:
    """Runs fit's steps on one planned train graph."""

    def __init__(
        self,
        model: Module,
        *,
        sample_shape: Sequence[int],
        loss: str,
        optimizer: Optimizer,
        label_smoothing: float,
        num_threads: int | None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.train_model = train_graph(
            model, sample_shape, loss=loss, optimizer=optimizer, label_smoothing=label_smoothing
        )
        self.trainer = Trainer(self.train_model, num_threads=num_threads)
        tensors = self.train_model.tensors
        by_name = {tensors[i].name: i for i in self.trainer.variables}
        # Module state (parameters and buffers) the trainer updates, by tensor index.
        self.state = [(by_name[name], p) for name, p in model.named_state() if name in by_name]
        self.by_name = by_name
        self.slots = {tensors[i].name: i for i in optimizer_slots(self.train_model)}
        # Continue from the optimizer's state (an earlier fit, or a loaded checkpoint).
        for name, i in self.slots.items():
            saved = optimizer.state.slots.get(name)
            if saved is not None:
                np.copyto(self.trainer.variables[i], saved.reshape(tensors[i].shape))
        for i, p in self.state:
            np.copyto(self.trainer.variables[i], p.value)

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        loss = self.trainer.step({INPUT_NAME: x, "labels": y}, lr)
        self.optimizer.state.step += 1
        return loss

    def predict(self, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """Eval-mode outputs from the trainer's infer plan (current weights, no re-plan)."""
        return np.concatenate(
            [
                self.trainer.evaluate({INPUT_NAME: x[i : i + batch_size]})[LOGITS_NAME]
                for i in range(0, len(x), batch_size)
            ]
        )

    def parameter(self, name: str) -> np.ndarray:
        """The trainer's writable copy of parameter `name` (what the next step reads)."""
        return self.trainer.variables[self.by_name[name]]

    def sync(self) -> None:
        """Copy weights, running statistics and optimizer slots out of the trainer."""
        for i, p in self.state:
            np.copyto(p.value, self.trainer.variables[i])
        for name, i in self.slots.items():
            self.optimizer.state.slots[name] = self.trainer.variables[i].copy()

    def close(self) -> None:
        self.sync()
