"""A federated client that trains with the on-device runtime: no glue code.

    learner = LiteLearner("digits.spore", x, y, x_eval=xt, y_eval=yt,
                          trainable={"head.weight", "head.bias"})
    client = learner.client("127.0.0.1:8080", name="phone-1")   # a sporenet.federated.Client
    client.run()

`LiteLearner.train` and `LiteLearner.evaluate` are the `train`/`evaluate` callables a
`Client` takes. Each round, `train` loads the round's global weights into one lite
`Trainer` (built once; rebuilt only if weights it does not train change), resets the
optimizer, and runs the round's config:

- `epochs` (int >= 1), `lr` or `learning_rate` (float > 0), `batch_size` (int >= 1):
  override the learner's defaults;
- `lr_decay` (float in (0, 1], default the learner's, 1: none): the round's rate is
  lr · lr_decay^(round - 1), `round` being the job's round (an async job's buffer) the
  server puts in every task's config. Federated SGD at a constant rate keeps the global
  model jumping around its plateau; a decaying one lets it settle, as a central schedule
  does. The decay is per round, never per step, so every device of a round trains at the
  same rate;
- `proximal_mu` (FedProx, float >= 0): adds (mu/2)·||w - w_global||² to the loss. Its
  gradient mu·(w - w_global) is applied after each optimizer step with the step's rate,
  which is exactly FedProx's update for plain SGD (the default optimizer here).

Only the public `sporenet.federated` API and `sporenet.lite` are used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sporenet import lite
from sporenet.federated import Client, ConfigError
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model


def _model(source: str | os.PathLike | bytes | lite.Model) -> lite.Model:
    if isinstance(source, lite.Model):
        return source
    if isinstance(source, bytes | bytearray | memoryview):
        return lite.parse(bytes(source))
    return lite.load(Path(source))


def _number(
    config: Mapping[str, Any],
    keys: tuple[str, ...],
    default: float,
    *,
    integer: bool = False,
    minimum: float = 0.0,
    strict: bool = True,
) -> Any:
    """A config value by the first present key, checked (ConfigError names the key)."""
    for key in keys:
        if key in config:
            value = config[key]
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and (value > minimum if strict else value >= minimum)
            )
            if integer and ok:
                ok = float(value).is_integer()
            if not ok:
                sign = ">" if strict else ">="
                kind = "an integer" if integer else "a number"
                raise ConfigError(
                    f"round config `{key}` must be {kind} {sign} {minimum}, got {value!r}"
                )
            return int(value) if integer else float(value)
    return default


def _decay(config: Mapping[str, Any], default: float) -> float:
    """`lr_decay` of `config` (or `default`), checked to lie in (0, 1]."""
    decay = _number(config, ("lr_decay",), default)
    if decay > 1:
        raise ConfigError(f"round config `lr_decay` must be in (0, 1], got {decay!r}")
    return float(decay)


class LiteLearner:
    """Train and evaluate callables for a federated Client, from a .spore model and local
    data, run with the lite Trainer."""

    def __init__(
        self,
        model: str | os.PathLike | bytes | lite.Model,
        x: np.ndarray,
        y: np.ndarray,
        *,
        x_eval: np.ndarray | None = None,
        y_eval: np.ndarray | None = None,
        trainable: set[str] | None = None,
        output: str = "logits",
        lr: float = 0.05,
        epochs: int = 1,
        batch_size: int = 32,
        lr_decay: float = 1.0,
        momentum: float = 0.0,
        seed: int = 0,
        num_threads: int | None = 1,
    ) -> None:
        self.base = _model(model)
        infer = self.base.signature("infer")
        if len(infer.inputs) != 1:
            raise ConfigError(f"the model must have one input, it has {sorted(infer.inputs)}")
        self.input = next(iter(infer.inputs))
        self.sample_shape = tuple(self.base.tensors[infer.inputs[self.input]].shape[1:])
        self.x, self.y = np.asarray(x, np.float32), np.asarray(y, np.int64)
        if len(self.x) != len(self.y) or len(self.y) == 0:
            raise ConfigError(
                f"x and y must hold the same number (> 0) of samples, got "
                f"{len(self.x)} and {len(self.y)}"
            )
        self.x_eval = self.x if x_eval is None else np.asarray(x_eval, np.float32)
        self.y_eval = self.y if y_eval is None else np.asarray(y_eval, np.int64)
        defaults = {"lr": lr, "epochs": epochs, "batch_size": batch_size}
        self.lr = _number(defaults, ("lr",), lr)
        self.epochs = _number(defaults, ("epochs",), epochs, integer=True)
        self.batch_size = _number(defaults, ("batch_size",), batch_size, integer=True)
        self.lr_decay = _decay({"lr_decay": lr_decay}, lr_decay)
        self.output, self.trainable, self.num_threads = output, trainable, num_threads
        self.optimizer = OptimizerConfig("sgd", lr=self.lr, momentum=momentum)
        self.rng = np.random.default_rng(seed)
        self._trainer: Trainer | None = None
        self._frozen: dict[str, np.ndarray] = {}

    def _shaped(self, x: np.ndarray) -> np.ndarray:
        """Samples in the model's input shape (flat rows of the same size are reshaped)."""
        x = np.asarray(x, np.float32)
        if (
            x.shape[1:] != self.sample_shape
            and -1 not in self.sample_shape
            and (x[0].size == int(np.prod(self.sample_shape)))
        ):
            return x.reshape(len(x), *self.sample_shape)
        return x

    # ---- the trainer, built once
    def trainer(self, weights: Mapping[str, np.ndarray]) -> Trainer:
        """The Trainer holding `weights`, with a fresh optimizer."""
        state = self._trainer.weights() if self._trainer is not None else {}
        frozen = {k: v for k, v in weights.items() if k not in state}
        if self._trainer is None or any(
            k not in self._frozen or not np.array_equal(v, self._frozen[k])
            for k, v in frozen.items()
        ):
            base = lite.replace_weights(self.base, dict(weights))
            train = make_training_model(
                base,
                output=self.output,
                loss="softmax_cross_entropy",
                optimizer=self.optimizer,
                trainable=self.trainable,
            )
            self._trainer = Trainer(train, num_threads=self.num_threads)
            self._frozen = {
                k: np.array(v) for k, v in weights.items() if k not in self._trainer.weights()
            }
        self._trainer.set_weights(dict(weights))
        self._trainer.reset_optimizer()
        return self._trainer

    def round_lr(self, config: Mapping[str, Any]) -> float:
        """The learning rate of the round `config` configures: its (or the learner's) lr,
        decayed by lr_decay once per round after the first."""
        lr = _number(config, ("lr", "learning_rate"), self.lr)
        decay = _decay(config, self.lr_decay)
        rnd = _number(config, ("round",), 1, integer=True, strict=False)
        return float(lr * decay ** max(rnd - 1, 0))

    # ---- the Client's callables
    def train(
        self, weights: Mapping[str, np.ndarray], config: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], int, dict[str, float]]:
        """One round of local training: (new weights, samples, {"loss": mean loss})."""
        epochs = _number(config, ("epochs",), self.epochs, integer=True)
        lr = self.round_lr(config)
        batch = _number(config, ("batch_size",), self.batch_size, integer=True)
        mu = _number(config, ("proximal_mu",), 0.0, strict=False)
        trainer = self.trainer(weights)
        trained = [
            i
            for i in trainer.variables
            if trainer.model.tensors[i].name in weights and trainer.model.tensors[i].trainable
        ]
        anchor = {i: trainer.variables[i].copy() for i in trained} if mu else {}
        losses = []
        x = self._shaped(self.x)
        for _ in range(epochs):
            order = self.rng.permutation(len(self.y))
            for start in range(0, len(order), batch):
                rows = order[start : start + batch]
                before = {i: trainer.variables[i].copy() for i in anchor}
                losses.append(trainer.step({self.input: x[rows], "labels": self.y[rows]}, lr))
                for i, w0 in before.items():  # FedProx: - lr * mu * (w_t - w_global)
                    trainer.variables[i] -= np.float32(lr * mu) * (w0 - anchor[i])
        new = trainer.weights()
        result = {
            name: (new[name] if name in new else np.asarray(value))
            for name, value in weights.items()
        }
        return result, len(self.y), {"loss": float(np.mean(losses))}

    def evaluate(
        self, weights: Mapping[str, np.ndarray], config: Mapping[str, Any]
    ) -> tuple[float, int, dict[str, float]]:
        """(cross-entropy loss, samples, {"accuracy": ...}) on the evaluation data."""
        trainer = self.trainer(weights)
        outputs = trainer.evaluate({self.input: self._shaped(self.x_eval)})
        logits = outputs[self.output].astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = float(-log_p[np.arange(len(self.y_eval)), self.y_eval].mean())
        accuracy = float(np.mean(logits.argmax(axis=1) == self.y_eval))
        return loss, len(self.y_eval), {"accuracy": accuracy}

    def client(self, address: str, **client_kwargs: Any) -> Client:
        """A `sporenet.federated.Client` that trains and evaluates with this learner."""
        return Client(address, train=self.train, evaluate=self.evaluate, **client_kwargs)
