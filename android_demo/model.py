"""The app's model: the shipped .spore file, personalized on the device.

Predictions run the user's model (the shipped one until the user personalizes it) with the
lite Interpreter. Personalization fine-tunes only the head (the FullyConnected layer that
produces the logits) with the lite Trainer on the user's own samples and keeps the result
in the data directory as personal.spore: the user's model, which federated rounds never
replace.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sporenet import lite
from sporenet.android_demo.errors import AppError
from sporenet.lite import Interpreter, OpCode
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model

PERSONAL_FILE = "personal.spore"
Progress = Callable[[int, int, float], None]
"""progress(epoch done, epochs, last loss)"""


def head_parameters(model: lite.Model, output: str = "logits") -> set[str]:
    """Names of the weight and bias of the FullyConnected layer that produces `output`."""
    sig = model.signature("infer")
    if output not in sig.outputs:
        raise AppError(f"the model has no output {output!r}; outputs are {sorted(sig.outputs)}")
    target = sig.outputs[output]
    for graph in model.graphs:
        for node in graph.nodes:
            if target in node.outputs and node.op == OpCode.FULLY_CONNECTED:
                return {model.tensors[i].name for i in node.inputs[1:] if i != -1}
    raise AppError(f"output {output!r} is not produced by a FullyConnected head")


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class DeviceModel:
    """Predict with the user's model; personalize its head; save it in the data dir."""

    def __init__(
        self, model_path: Path, data_dir: Path, *, lr: float = 3e-3, batch_size: int = 32
    ) -> None:
        self.base_bytes = Path(model_path).read_bytes()
        self.base = lite.parse(self.base_bytes)
        self.personal_path = data_dir / PERSONAL_FILE
        self.lr, self.batch_size = lr, batch_size
        sig = self.base.signature("infer")
        if len(sig.inputs) != 1 or "logits" not in sig.outputs:
            raise AppError(
                f"the app needs a model with one input and a 'logits' output; this "
                f"one has inputs {sorted(sig.inputs)}, outputs {sorted(sig.outputs)}"
            )
        self.input = next(iter(sig.inputs))
        shape = self.base.tensors[sig.inputs[self.input]].shape
        if int(np.prod([d for d in shape[1:]])) != 64:
            raise AppError(
                f"the app draws 8x8 digits: the model's input must hold 64 values "
                f"per sample, its shape is {list(shape)}"
            )
        self.sample_shape = tuple(int(d) for d in shape[1:])
        self.head = head_parameters(self.base)
        self._lock = threading.Lock()
        self.personalizations = 0
        model = self.base
        if self.personal_path.exists():
            model = lite.load(self.personal_path)
            self.personalizations = int(model.metadata.get("app.personalizations", "1"))
        self._use(model)

    @property
    def version(self) -> str:
        """The shipped file's CRC-32, plus how often the user personalized it."""
        base = f"{zlib.crc32(self.base_bytes):08x}"
        return base if not self.personalizations else f"{base}+p{self.personalizations}"

    def _use(self, model: lite.Model) -> None:
        interpreter = Interpreter(model=model, num_threads=1)
        with self._lock:
            self.model, self.interpreter = model, interpreter

    def _batch(self, pixels: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(pixels, np.float32).reshape(-1, *self.sample_shape)

    def logits(self, pixels: np.ndarray) -> np.ndarray:
        """Logits for (N, 64) pixel rows."""
        with self._lock:
            return self.interpreter.run({self.input: self._batch(pixels)})["logits"]

    def predict(self, pixels: np.ndarray) -> tuple[int, np.ndarray, float]:
        """(label, probabilities, latency in ms) for one sample's 64 pixels."""
        start = time.perf_counter()
        probabilities = _softmax(self.logits(pixels.reshape(1, 64))[0].astype(np.float64))
        latency = (time.perf_counter() - start) * 1e3
        return int(probabilities.argmax()), probabilities, latency

    def accuracy(self, x: np.ndarray, y: np.ndarray, model: lite.Model | None = None) -> float:
        if len(y) == 0:
            return float("nan")
        if model is None:
            logits = self.logits(x)
        else:
            logits = Interpreter(model=model).run({self.input: self._batch(x)})["logits"]
        return float(np.mean(logits.argmax(axis=1) == y))

    def personalize(
        self,
        x: np.ndarray,
        y: np.ndarray,
        x_held: np.ndarray,
        y_held: np.ndarray,
        *,
        epochs: int,
        progress: Progress | None = None,
        seed: int = 0,
    ) -> tuple[float, float]:
        """Fine-tune the head on (x, y); returns accuracy on the held-out samples before and
        after. The result becomes the user's model and is saved in the data dir."""
        with self._lock:
            current = self.model
        before = self.accuracy(x_held, y_held)
        train = make_training_model(
            current,
            output="logits",
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig("adam", lr=self.lr),
            trainable=self.head,
        )
        trainer = Trainer(train, num_threads=1)
        rng = np.random.default_rng(seed)
        xb = self._batch(x)
        for epoch in range(epochs):
            order = rng.permutation(len(y))
            loss = 0.0
            for start in range(0, len(y), self.batch_size):
                rows = order[start : start + self.batch_size]
                loss = trainer.step({self.input: xb[rows], "labels": y[rows]}, self.lr)
            if progress is not None:
                progress(epoch + 1, epochs, loss)
        tuned = trainer.export()
        tuned.metadata["app.personalizations"] = str(self.personalizations + 1)
        tmp = self.personal_path.with_suffix(".tmp")
        lite.save(tuned, tmp)
        os.replace(tmp, self.personal_path)
        self.personalizations += 1
        self._use(tuned)
        return before, self.accuracy(x_held, y_held)
