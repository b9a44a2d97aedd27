"""Optimizer updates as ops: SGD_UPDATE, ADAM_UPDATE and ASSIGN write variables in place.

They have no outputs, so a train graph lists them last, after every backward node that
reads the old parameter values. The learning rate is an input (a scalar tensor), so a
schedule changes it between steps without re-planning. The math follows torch.optim:

SGD_UPDATE(param, grad, lr[, momentum_buffer]): g = grad + weight_decay * param;
buf = momentum * buf + g; g = g + momentum * buf (nesterov) or buf; param -= lr * g.

ADAM_UPDATE(param, grad, lr, m, v, step): step += 1; with decoupled=0 (Adam) the weight
decay is added to the gradient, with decoupled=1 (AdamW) param *= 1 - lr * weight_decay;
m, v are the biased moment estimates; param -= lr / (1 - beta1^step) *
m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import raw
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


class UpdateKernel(Kernel):
    """Common checks: a float parameter, a gradient of its shape, a scalar learning rate."""

    foldable = False  # stateful: writes its inputs, so it must run every step

    def _check_common(self) -> TensorSpec:
        param, grad, lr = self.require_float(0), self.input(1), self.input(2)
        if grad.shape != param.shape or grad.dtype != param.dtype:
            raise self.fail(
                f"gradient {grad.dtype}{list(grad.shape)} does not match the "
                f"parameter {param.dtype}{list(param.shape)}"
            )
        if lr.size != 1 or lr.dtype.kind != "f":
            raise self.fail(
                f"the learning rate must be a float scalar, got {lr.dtype}{list(lr.shape)}"
            )
        return param

    def _check_slot(self, index: int, what: str, like: TensorSpec) -> None:
        slot = self.input(index)
        if slot.shape != like.shape or slot.dtype != like.dtype:
            raise self.fail(
                f"input {index} ({what}) must be {like.dtype}{list(like.shape)} "
                f"like the parameter, got {slot.dtype}{list(slot.shape)}"
            )


class SGDUpdate(UpdateKernel):
    op = OpCode.SGD_UPDATE
    num_inputs = (3, 4)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        param = self._check_common()
        self.momentum = attrs.float("momentum", 0.0)
        self.nesterov = bool(attrs.int("nesterov", 0))
        self.weight_decay = attrs.float("weight_decay", 0.0)
        if self.momentum < 0 or self.weight_decay < 0:
            raise self.fail(
                f"momentum ({self.momentum}) and weight_decay ({self.weight_decay}) must be >= 0"
            )
        if self.nesterov and self.momentum == 0:
            raise self.fail("nesterov needs a momentum > 0")
        if self.momentum:
            self._check_slot(3, "momentum buffer", param)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        param, grad, lr = inputs[0], inputs[1], inputs[2].reshape(())
        buf = inputs[3] if self.momentum else None
        mu, wd, nesterov = self.momentum, self.weight_decay, self.nesterov
        decayed, step = np.empty_like(param), np.empty_like(param)

        def compute() -> None:
            d = grad
            if wd:
                np.multiply(param, wd, out=decayed)
                np.add(decayed, grad, out=decayed)
                d = decayed
            if buf is not None:
                np.multiply(buf, mu, out=buf)
                np.add(buf, d, out=buf)
                if nesterov:
                    np.multiply(buf, mu, out=step)
                    np.add(step, d, out=step)
                    d = step
                else:
                    d = buf
            np.multiply(d, lr, out=step)
            np.subtract(param, step, out=param)

        return compute


class AdamUpdate(UpdateKernel):
    op = OpCode.ADAM_UPDATE
    num_inputs = (6, 6)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        param = self._check_common()
        self._check_slot(3, "first moment", param)
        self._check_slot(4, "second moment", param)
        step = self.input(5)
        if step.size != 1:
            raise self.fail(f"input 5 (step count) must hold one value, got {list(step.shape)}")
        self.beta1 = attrs.float("beta1", 0.9)
        self.beta2 = attrs.float("beta2", 0.999)
        self.eps = attrs.float("eps", 1e-8)
        self.weight_decay = attrs.float("weight_decay", 0.0)
        self.decoupled = bool(attrs.int("decoupled", 0))
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise self.fail(f"betas must be in [0, 1), got ({self.beta1}, {self.beta2})")
        if self.eps <= 0 or self.weight_decay < 0:
            raise self.fail(
                f"eps ({self.eps}) must be > 0 and weight_decay ({self.weight_decay}) >= 0"
            )

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        param, grad, lr = inputs[0], inputs[1], inputs[2].reshape(())
        m, v, step = inputs[3], inputs[4], inputs[5].reshape(())
        b1, b2, eps, wd, decoupled = (
            self.beta1,
            self.beta2,
            self.eps,
            self.weight_decay,
            self.decoupled,
        )
        g2, tmp = np.empty_like(param), np.empty_like(param)

        def compute() -> None:
            step[...] = step + 1
            t = float(step)
            rate = float(lr)
            g = grad
            if wd and decoupled:
                np.multiply(param, 1 - rate * wd, out=param)
            elif wd:
                np.multiply(param, wd, out=g2)
                np.add(g2, grad, out=g2)
                g = g2
            np.multiply(m, b1, out=m)
            np.multiply(g, 1 - b1, out=tmp)
            np.add(m, tmp, out=m)
            np.multiply(v, b2, out=v)
            np.square(g, out=tmp)
            np.multiply(tmp, 1 - b2, out=tmp)
            np.add(v, tmp, out=v)
            step_size = rate / (1 - b1**t)
            np.sqrt(v, out=tmp)
            np.multiply(tmp, 1 / math.sqrt(1 - b2**t), out=tmp)
            np.add(tmp, eps, out=tmp)
            np.divide(m, tmp, out=tmp)
            np.multiply(tmp, step_size, out=tmp)
            np.subtract(param, tmp, out=param)

        return compute


class Assign(UpdateKernel):
    """ASSIGN(target, value): copy value into the variable target."""

    op = OpCode.ASSIGN
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        target, value = self.input(0), self.input(1)
        if target.shape != value.shape or target.dtype != value.dtype:
            raise self.fail(
                f"value {value.dtype}{list(value.shape)} does not match the "
                f"target {target.dtype}{list(target.shape)}"
            )

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        target, value = inputs[0], inputs[1]
        return lambda: raw.copyto(target, value)
