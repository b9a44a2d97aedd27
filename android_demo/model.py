"""The app's model: the shipped .spore file, personalized on the device.

Predictions run the user's model (the shipped one until the user personalizes it) with the
lite Interpreter. Personalization fine-tunes only the head (see head.py) with the lite
Trainer on the user's own samples and keeps the result in the data directory as
personal.spore: the user's model, which federated rounds never replace.

Any model the runtime runs works: one input of 64 values per sample (any layout, float or
quantized), and a `logits` output (or one single output). A model whose batch dimension
is fixed (an ONNX export with input [1, 64]) runs and trains in batches of that size
(per-sample Adam steps at a proportionally smaller learning rate when it is 1). An int8
model's head trains as a float copy (head.py), so the user's model becomes int8 up to
the head and float in it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sporenet import lite
from sporenet.android_demo.errors import AppError, PersonalizationUnavailableError
from sporenet.android_demo.head import Head, find_head, float_head_copy
from sporenet.lite import Interpreter, OpCode
from sporenet.lite.graph import DYNAMIC
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model

PERSONAL_FILE = "personal.spore"
PIXELS = 64
PIXEL_RANGE = (0.0, 16.0)
Progress = Callable[[int, int, float], None]
"""progress(epoch done, epochs, last loss)"""


def logits_output(model: lite.Model) -> str:
    """`logits`, or the one output of a model that has one (not a softmax's)."""
    sig = model.signature("infer")
    if "logits" in sig.outputs:
        return "logits"
    if len(sig.outputs) == 1:
        name = next(iter(sig.outputs))
        graph = model.graphs[sig.graph]
        producer = next((n for n in graph.nodes if sig.outputs[name] in n.outputs), None)
        if producer is None or producer.op != OpCode.SOFTMAX:
            return name
    raise AppError(
        f"the app needs a 'logits' output (or one output that is not a softmax); this model "
        f"has outputs {sorted(sig.outputs)}"
    )


def _input_range(model: lite.Model) -> tuple[float, float]:
    """The pixel range the model expects (metadata "input" range), else the digits' 0-16."""
    try:
        value = json.loads(model.metadata.get("input", "{}")).get("range")
        lo, hi = float(value[0]), float(value[1])
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        return PIXEL_RANGE
    return (lo, hi) if hi > lo else PIXEL_RANGE


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class DeviceModel:
    """Predict with the user's model; personalize its head; save it in the data dir."""

    def __init__(
        self,
        model_path: Path,
        data_dir: Path,
        *,
        lr: float = 3e-3,
        batch_size: int = 32,
        num_threads: int = 1,
    ) -> None:
        self.base_bytes = Path(model_path).read_bytes()
        self.base = lite.parse(self.base_bytes)
        self.personal_path = data_dir / PERSONAL_FILE
        self.lr, self.num_threads = lr, num_threads
        sig = self.base.signature("infer")
        if len(sig.inputs) != 1:
            raise AppError(
                f"the app needs a model with one input; this one has inputs {sorted(sig.inputs)}"
            )
        self.output = logits_output(self.base)
        self.input = next(iter(sig.inputs))
        tensor = self.base.tensors[sig.inputs[self.input]]
        shape = tensor.shape
        if len(shape) < 2 or DYNAMIC in shape[1:] or int(np.prod(shape[1:])) != PIXELS:
            raise AppError(
                f"the app draws 8x8 digits: the model's input must hold {PIXELS} values per "
                f"sample (batch first), its shape is {list(shape)}"
            )
        self.sample_shape = tuple(int(d) for d in shape[1:])
        self.fixed_batch = None if shape[0] == DYNAMIC else int(shape[0])
        self.batch_size = self.fixed_batch or batch_size
        self.input_dtype = tensor.dtype
        self.input_quantization = tensor.quantization
        self.range = _input_range(self.base)
        self.classes = int(self.base.tensors[sig.outputs[self.output]].shape[-1])
        self.head: Head = find_head(self.base, self.output)
        # What personalization starts from: the shipped model, or for an int8 head the
        # shipped model with a float copy of it (federated rounds exchange the shipped
        # model's own weights, so they cannot use the copy).
        self.train_base = self.base
        self.federated_reason = self.head.reason
        self.float_copy = False
        if not self.head.available:
            copied, head = float_head_copy(self.base, self.output)
            if head.available:
                self.train_base, self.head, self.float_copy = copied, head, True
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

    def describe(self) -> dict[str, object]:
        """What the status shows about the model."""
        return {
            "input": self.input,
            "input_shape": [
                -1 if self.fixed_batch is None else self.fixed_batch,
                *self.sample_shape,
            ],
            "input_dtype": str(self.input_dtype),
            "output": self.output,
            "classes": self.classes,
            "batch": self.fixed_batch,
            "trainable": sorted(self.head.names),
            "personalizable": self.head.available,
            "why_not": self.head.reason,
            "float_head_copy": self.float_copy,
        }

    def _use(self, model: lite.Model) -> None:
        interpreter = Interpreter(model=model, num_threads=self.num_threads)
        with self._lock:
            self.model, self.interpreter = model, interpreter

    def _feed(self, pixels: np.ndarray) -> np.ndarray:
        """(N, 64) pixels in 0-16 -> the model's input: its range, layout and dtype."""
        lo, hi = self.range
        x = np.asarray(pixels, np.float32).reshape(-1, *self.sample_shape)
        if (lo, hi) != PIXEL_RANGE:
            x = lo + x * np.float32((hi - lo) / PIXEL_RANGE[1])
        if self.input_dtype.kind == "f":
            return np.ascontiguousarray(x, self.input_dtype)
        q = self.input_quantization
        if q is not None and q.scale.size == 1:
            x = np.round(x / float(q.scale.reshape(-1)[0])) + int(q.zero_point.reshape(-1)[0])
        info = np.iinfo(self.input_dtype)
        return np.clip(np.round(x), info.min, info.max).astype(self.input_dtype)

    def _batches(self, x: np.ndarray) -> list[tuple[np.ndarray, int]]:
        """Rows in the model's batch size: (batch, real rows), the last one padded."""
        if self.fixed_batch is None:
            return [(x, len(x))]
        b = self.fixed_batch
        out = []
        for at in range(0, len(x), b):
            part = x[at : at + b]
            n = len(part)
            if n < b:
                part = np.concatenate([part, np.repeat(part[-1:], b - n, axis=0)])
            out.append((part, n))
        return out

    def _run(self, interpreter: Interpreter, x: np.ndarray) -> np.ndarray:
        outs = [
            np.asarray(interpreter.run({self.input: part})[self.output], np.float64)[:n]
            for part, n in self._batches(x)
        ]
        return np.concatenate(outs).reshape(len(x), -1)

    def logits(self, pixels: np.ndarray) -> np.ndarray:
        """Logits (float64) for (N, 64) pixel rows."""
        x = self._feed(pixels)
        with self._lock:
            return self._run(self.interpreter, x)

    def predict(self, pixels: np.ndarray) -> tuple[int, np.ndarray, float]:
        """(label, probabilities, latency in ms) for one sample's 64 pixels."""
        start = time.perf_counter()
        probabilities = _softmax(self.logits(pixels.reshape(1, PIXELS))[0])
        latency = (time.perf_counter() - start) * 1e3
        return int(probabilities.argmax()), probabilities, latency

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        if len(y) == 0:
            return float("nan")
        return float(np.mean(self.logits(x).argmax(axis=1) == y))

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
        after. The result becomes the user's model and is saved in the data dir.

        Raises:
            PersonalizationUnavailableError: the model has no float head to train.
        """
        if not self.head.available:
            raise PersonalizationUnavailableError(self.head.reason)
        with self._lock:
            current = self.model if self.personalizations else self.train_base
        before = self.accuracy(x_held, y_held)
        # Adam moves each weight about lr per step: smaller batches take more steps, so
        # the rate shrinks with the batch and an epoch moves the head as far.
        lr = self.lr * min(1.0, self.batch_size / 32)
        train = make_training_model(
            current,
            output=self.output,
            loss="softmax_cross_entropy",
            optimizer=OptimizerConfig("adam", lr=lr),
            trainable=set(self.head.names),
        )
        trainer = Trainer(train, num_threads=self.num_threads)
        rng = np.random.default_rng(seed)
        xb = self._feed(x)
        for epoch in range(epochs):
            order = rng.permutation(len(y))
            loss = 0.0
            for start in range(0, len(y), self.batch_size):
                rows = order[start : start + self.batch_size]
                if self.fixed_batch is not None and len(rows) < self.fixed_batch:
                    # A fixed batch is filled with other samples drawn at random.
                    extra = rng.choice(len(y), self.fixed_batch - len(rows))
                    rows = np.concatenate([rows, extra])
                loss = trainer.step({self.input: xb[rows], "labels": y[rows]}, lr)
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
