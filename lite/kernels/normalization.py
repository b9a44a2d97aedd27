"""Channel normalizations on (N, C, ...) tensors: BatchNorm (inference), LRN, InstanceNorm.

LayerNorm lives in its own module; these three normalize along or within the channel axis.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode


def _channel_params(kernel: Kernel, x: TensorSpec, first: int, names: Sequence[str]) -> None:
    """Check that inputs first.. are per-channel vectors (C,) of x's dtype."""
    c = x.shape[1]
    for k, name in enumerate(names, start=first):
        spec = kernel.input(k)
        if spec.shape != (c,):
            raise kernel.fail(
                f"{name} (input {k}) must have shape [{c}] (the channels of input shape "
                f"{list(x.shape)}), got {list(spec.shape)}"
            )
        if spec.dtype != x.dtype:
            raise kernel.fail(f"{name} (input {k}) dtype {spec.dtype} differs from {x.dtype}")


def _channels_first(kernel: Kernel, x: TensorSpec, min_rank: int) -> None:
    if x.rank < min_rank:
        raise kernel.fail(f"input must be (N, C, ...) of rank >= {min_rank}, got {list(x.shape)}")


class BatchNorm(Kernel):
    """Inference batch norm: y = scale * (x - mean) / sqrt(var + epsilon) + bias.

    Inputs (ONNX order): X, scale, bias, mean, var. With constant statistics (the usual
    case) it is folded at prepare into y = a * x + b with one (a, b) pair per channel.
    """

    op = OpCode.BATCH_NORM
    num_inputs = (5, 5)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        _channels_first(self, x, 2)
        _channel_params(self, x, 1, ("scale", "bias", "mean", "var"))
        if attrs.int("training_mode", 0) != 0:
            raise self.fail("training_mode=1 is not supported by the inference kernel")
        self.epsilon = attrs.float("epsilon", 1e-5)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]
        self.bshape = (x.shape[1],) + (1,) * (x.rank - 2)
        values = [self.input(k).value for k in range(1, len(self.inputs))]
        self.folded = None
        if all(v is not None for v in values):
            self.folded = self._fold(*values)

    def _fold(
        self, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + self.epsilon)
        b = bias - mean.astype(np.float64) * a
        dtype = self.input(0).dtype
        return a.astype(dtype).reshape(self.bshape), b.astype(dtype).reshape(self.bshape)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        multiply, add = np.multiply, np.add
        if self.folded is not None:
            a, b = self.folded

            def compute() -> None:
                multiply(x, a, out=out)
                add(out, b, out=out)

            return compute

        params = inputs[1:]

        def compute_runtime() -> None:
            a, b = self._fold(*params)  # type: ignore[arg-type]
            multiply(x, a, out=out)
            add(out, b, out=out)

        return compute_runtime


class LRN(Kernel):
    """Local response normalization across channels (ONNX):

    y = x / (bias + alpha / size * sum of x^2 over channels
             [c - floor((size-1)/2), c + ceil((size-1)/2)]) ** beta
    """

    op = OpCode.LRN

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        _channels_first(self, x, 3)
        self.size = attrs.int("size", None)
        if self.size is None or self.size < 1:
            raise self.fail(f"attribute 'size' must be a positive int, got {self.size!r}")
        self.alpha = attrs.float("alpha", 1e-4)
        self.beta = attrs.float("beta", 0.75)
        self.bias = attrs.float("bias", 1.0)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        n, c = x.shape[:2]
        before = (self.size - 1) // 2
        after = self.size - 1 - before
        # Squares live in a channel-padded scratch so every window is a plain slice.
        sq = np.zeros((n, c + before + after, *x.shape[2:]), x.dtype)
        sq_mid = sq[:, before : before + c]
        windows = [sq[:, k : k + c] for k in range(self.size)]
        acc = temporary(out.shape, out.dtype)  # rewritten every call: from the plan's arena
        scale = np.asarray(self.alpha / self.size, x.dtype)
        bias, beta = np.asarray(self.bias, x.dtype), np.asarray(self.beta, x.dtype)
        multiply, add, power, divide, copyto = (np.multiply, np.add, np.power, np.divide, np.copyto)

        def compute() -> None:
            multiply(x, x, out=sq_mid)
            copyto(acc, windows[0])
            for v in windows[1:]:
                add(acc, v, out=acc)
            multiply(acc, scale, out=acc)
            add(acc, bias, out=acc)
            power(acc, beta, out=acc)
            divide(x, acc, out=out)

        return compute


class InstanceNorm(Kernel):
    """y = scale * (x - mean) / sqrt(var + epsilon) + bias, statistics per (n, c) over the
    spatial axes (ONNX InstanceNormalization; inputs X, scale, bias)."""

    op = OpCode.INSTANCE_NORM
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        _channels_first(self, x, 3)
        _channel_params(self, x, 1, ("scale", "bias"))
        self.epsilon = attrs.float("epsilon", 1e-5)
        self.output_specs = [TensorSpec(x.shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, scale, bias, out = inputs[0], inputs[1], inputs[2], outputs[0]
        n, c = x.shape[:2]
        x3, out3 = x.reshape(n, c, -1), out.reshape(n, c, -1)
        stat = np.empty((n, c, 1), x.dtype)
        sq = temporary(out3.shape, out3.dtype)  # rewritten every call: from the plan's arena
        s2, b2 = scale.reshape(c, 1), bias.reshape(c, 1)
        eps = np.asarray(self.epsilon, x.dtype)
        mean, subtract, multiply, add, sqrt, divide = (
            np.mean,
            np.subtract,
            np.multiply,
            np.add,
            np.sqrt,
            np.divide,
        )

        def compute() -> None:
            mean(x3, axis=2, keepdims=True, out=stat)
            subtract(x3, stat, out=out3)
            multiply(out3, out3, out=sq)
            mean(sq, axis=2, keepdims=True, out=stat)
            add(stat, eps, out=stat)
            sqrt(stat, out=stat)
            divide(out3, stat, out=out3)
            multiply(out3, s2, out=out3)
            add(out3, b2, out=out3)

        return compute
