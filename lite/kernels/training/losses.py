"""Loss kernels and their gradients; every loss is the mean over the batch (a scalar).

SOFTMAX_CROSS_ENTROPY(logits (N, C), labels) -> (loss, probabilities): labels are integer
class ids (N,) or per-class targets (N, C) such as one-hot rows; `label_smoothing` mixes
the targets with the uniform distribution as PyTorch does. MSE_LOSS(pred, target) is the
mean squared error over all elements; BCE_WITH_LOGITS(logits, target) the mean binary
cross-entropy of sigmoid(logits), computed without overflow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.activation import exp_into
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


def _check_labels(kernel: Kernel, logits: TensorSpec, labels: TensorSpec) -> bool:
    """True for integer class ids, False for per-class float targets; raises otherwise."""
    if labels.dtype.kind in "iu":
        if labels.shape != logits.shape[:1]:
            raise kernel.fail(
                f"class-id labels must have shape [{logits.shape[0]}], got {list(labels.shape)}"
            )
        return True
    if labels.dtype != logits.dtype or labels.shape != logits.shape:
        raise kernel.fail(
            f"float labels must be {logits.dtype}{list(logits.shape)} like the "
            f"logits, got {labels.dtype}{list(labels.shape)}"
        )
    return False


class SoftmaxCrossEntropy(Kernel):
    """loss = mean_n -sum_c target[n, c] * log_softmax(logits)[n, c]; output 1 = softmax."""

    op = OpCode.SOFTMAX_CROSS_ENTROPY
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        logits, labels = self.require_float(0), self.input(1)
        if logits.rank != 2:
            raise self.fail(f"logits must be 2-D (batch, classes), got {list(logits.shape)}")
        self.class_ids = _check_labels(self, logits, labels)
        self.smoothing = attrs.float("label_smoothing", 0.0)
        if not 0.0 <= self.smoothing <= 1.0:
            raise self.fail(f"label_smoothing must be in [0, 1], got {self.smoothing}")
        self.output_specs = [TensorSpec((), logits.dtype), TensorSpec(logits.shape, logits.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        logits, labels = inputs[0], inputs[1]
        loss = outputs[0]
        n, c = logits.shape
        probs = outputs[1] if len(outputs) > 1 else np.empty_like(logits)
        logp = np.empty_like(logits)
        lse = np.empty((n, 1), logits.dtype)
        rows = np.arange(n)
        eps = self.smoothing

        def compute() -> None:
            np.max(logits, axis=1, keepdims=True, out=lse)
            np.subtract(logits, lse, out=logp)
            np.exp(logp, out=probs)
            np.sum(probs, axis=1, keepdims=True, out=lse)
            np.log(lse, out=lse)
            np.subtract(logp, lse, out=logp)
            np.exp(logp, out=probs)
            if self.class_ids:
                picked = logp[rows, labels].sum()
                total = -(1 - eps) * picked - (eps / c) * logp.sum() if eps else -picked
            else:
                total = -float(np.vdot(labels, logp))
                if eps:
                    total = (1 - eps) * total - (eps / c) * logp.sum()
            loss[...] = total / max(n, 1)

        return compute


class SoftmaxCrossEntropyGrad(Kernel):
    """dlogits = g * (softmax - target) / N, from (g, probabilities, labels)."""

    op = OpCode.SOFTMAX_CROSS_ENTROPY_GRAD
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, probs, labels = self.require_float(0), self.require_float(1), self.input(2)
        if g.size != 1:
            raise self.fail(f"the loss gradient must be a scalar, got shape {list(g.shape)}")
        self.class_ids = _check_labels(self, probs, labels)
        self.smoothing = attrs.float("label_smoothing", 0.0)
        self.output_specs = [TensorSpec(probs.shape, probs.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, probs, labels, out = inputs[0], inputs[1], inputs[2], outputs[0]
        n, c = probs.shape
        rows = np.arange(n)
        eps = self.smoothing

        def compute() -> None:
            scale = g.reshape(()) / max(n, 1)
            if eps:
                np.subtract(probs, eps / c, out=out)
            else:
                np.copyto(out, probs)
            if self.class_ids:
                out[rows, labels] -= 1 - eps
            else:
                np.subtract(out, labels if not eps else (1 - eps) * labels, out=out)
            np.multiply(out, scale, out=out)

        return compute


class MSELoss(Kernel):
    """loss = mean((pred - target)^2) over all elements."""

    op = OpCode.MSE_LOSS
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        pred, target = self.require_float(0), self.input(1)
        if target.shape != pred.shape or target.dtype != pred.dtype:
            raise self.fail(
                f"target must be {pred.dtype}{list(pred.shape)} like the "
                f"prediction, got {target.dtype}{list(target.shape)}"
            )
        self.output_specs = [TensorSpec((), pred.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        pred, target, loss = inputs[0], inputs[1], outputs[0]
        diff = np.empty_like(pred)
        count = max(pred.size, 1)

        def compute() -> None:
            np.subtract(pred, target, out=diff)
            d = diff.reshape(-1)
            loss[...] = np.dot(d, d) / count

        return compute


class MSELossGrad(Kernel):
    """dpred = g * 2 (pred - target) / size, from (g, pred, target)."""

    op = OpCode.MSE_LOSS_GRAD
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, pred, target = self.require_float(0), self.require_float(1), self.input(2)
        if g.size != 1:
            raise self.fail(f"the loss gradient must be a scalar, got shape {list(g.shape)}")
        if target.shape != pred.shape:
            raise self.fail(
                f"target shape {list(target.shape)} differs from the "
                f"prediction's {list(pred.shape)}"
            )
        self.output_specs = [TensorSpec(pred.shape, pred.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, pred, target, out = inputs[0], inputs[1], inputs[2], outputs[0]
        count = max(pred.size, 1)

        def compute() -> None:
            np.subtract(pred, target, out=out)
            np.multiply(out, g.reshape(()) * (2.0 / count), out=out)

        return compute


class BCEWithLogits(Kernel):
    """loss = mean(max(x, 0) - x * t + log(1 + exp(-|x|))), the stable form of BCE(sigmoid)."""

    op = OpCode.BCE_WITH_LOGITS
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, t = self.require_float(0), self.input(1)
        if t.shape != x.shape or t.dtype != x.dtype:
            raise self.fail(
                f"target must be {x.dtype}{list(x.shape)} like the logits, got "
                f"{t.dtype}{list(t.shape)}"
            )
        self.output_specs = [TensorSpec((), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, t, loss = inputs[0], inputs[1], outputs[0]
        a, b = np.empty_like(x), np.empty_like(x)
        count = max(x.size, 1)

        def compute() -> None:
            np.abs(x, out=a)
            np.negative(a, out=a)
            np.exp(a, out=a)
            np.log1p(a, out=a)
            np.maximum(x, 0, out=b)
            np.add(a, b, out=a)
            np.multiply(x, t, out=b)
            np.subtract(a, b, out=a)
            loss[...] = a.sum() / count

        return compute


class BCEWithLogitsGrad(Kernel):
    """dlogits = g * (sigmoid(x) - t) / size, from (g, logits, target)."""

    op = OpCode.BCE_WITH_LOGITS_GRAD
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x, t = self.require_float(0), self.require_float(1), self.input(2)
        if g.size != 1:
            raise self.fail(f"the loss gradient must be a scalar, got shape {list(g.shape)}")
        if t.shape != x.shape:
            raise self.fail(
                f"target shape {list(t.shape)} differs from the logits' {list(x.shape)}"
            )
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, t, out = inputs[0], inputs[1], inputs[2], outputs[0]
        count = max(x.size, 1)

        def compute() -> None:
            np.negative(x, out=out)
            exp_into(out, out)
            np.add(out, 1, out=out)
            np.reciprocal(out, out=out)
            np.subtract(out, t, out=out)
            np.multiply(out, g.reshape(()) / count, out=out)

        return compute
