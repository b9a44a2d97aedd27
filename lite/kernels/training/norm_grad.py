"""BatchNorm in training mode and the gradients of BatchNorm and LayerNorm.

BATCH_NORM_TRAINING(x, scale, bias, running_mean, running_var) normalizes with the batch
statistics over every axis but the channel axis 1, writes (y, batch mean, batch inverse
std) and updates the running statistics in place with PyTorch's convention (like the
optimizer ops): running = (1 - momentum) * running + momentum * batch, momentum 0.1 by
default (ONNX's attribute weighs the other side: ONNX 0.9 is momentum 0.1 here); the
running variance uses the unbiased batch variance, as PyTorch does.

BATCH_NORM_GRAD(g, x, scale, mean, invstd) -> (dx, dscale, dbias) with training=1 (mean
and invstd are the batch statistics, outputs 1 and 2 of BATCH_NORM_TRAINING). With
training=0 it differentiates inference BatchNorm (frozen statistics): inputs 3 and 4 are
then the running mean and variance, and `epsilon` applies.

LAYER_NORM_GRAD(g, x, scale) -> (dx, dscale, dbias) for LayerNorm over axes [axis, rank),
recomputing the statistics from x; dscale and dbias have the normalized shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


def _check_channels(kernel: Kernel, x: TensorSpec, first: int, last: int) -> None:
    if x.rank < 2:
        raise kernel.fail(f"x must be (N, C, ...) of rank >= 2, got {list(x.shape)}")
    for k in range(first, last):
        spec = kernel.input(k)
        if spec.shape != (x.shape[1],) or spec.dtype != x.dtype:
            raise kernel.fail(
                f"input {k} must be {x.dtype}[{x.shape[1]}] (one value per "
                f"channel), got {spec.dtype}{list(spec.shape)}"
            )


class BatchNormTraining(Kernel):
    op = OpCode.BATCH_NORM_TRAINING
    num_inputs = (5, 5)
    foldable = False  # updates the running statistics

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        _check_channels(self, x, 1, 5)
        self.epsilon = attrs.float("epsilon", 1e-5)
        self.momentum = attrs.float("momentum", 0.1)
        if not 0.0 <= self.momentum <= 1.0:
            raise self.fail(f"momentum must be in [0, 1], got {self.momentum}")
        # One value per channel (batch 1 of an (N, C) input) is allowed: shape inference
        # plans dynamic batches as 1. The unbiased correction then falls back to 1.
        self.count = x.size // max(x.shape[1], 1)
        self.axes = (0, *range(2, x.rank))
        c = (x.shape[1],)
        self.output_specs = [
            TensorSpec(x.shape, x.dtype),
            TensorSpec(c, x.dtype),
            TensorSpec(c, x.dtype),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, scale, bias, rmean, rvar = inputs
        out = outputs[0]
        n, c = x.shape[:2]
        mean = outputs[1] if len(outputs) > 1 else np.empty(c, x.dtype)
        invstd = outputs[2] if len(outputs) > 2 else np.empty(c, x.dtype)
        # (N, C, K) views: per-channel sums are a BLAS mat-vec over K, then a sum over N,
        # which is faster than NumPy's reduction over the non-adjacent axes (0, 2, 3).
        x3, out3 = x.reshape(n, c, -1), out.reshape(n, c, -1)
        ones = np.ones(x3.shape[2], x.dtype)
        partial = np.empty((n, c), x.dtype)
        var, a = np.empty(c, x.dtype), np.empty(c, x.dtype)
        mean3, a3, bias3 = mean.reshape(c, 1), a.reshape(c, 1), bias.reshape(c, 1)
        eps, mom, count = self.epsilon, self.momentum, self.count
        unbiased = count / max(count - 1, 1)

        def compute() -> None:
            np.matmul(x3, ones, out=partial)
            np.sum(partial, axis=0, out=mean)
            np.multiply(mean, 1.0 / count, out=mean)
            np.subtract(x3, mean3, out=out3)
            np.einsum("nck,nck->c", out3, out3, out=var)
            np.multiply(var, 1.0 / count, out=var)
            np.add(var, eps, out=invstd)
            np.sqrt(invstd, out=invstd)
            np.reciprocal(invstd, out=invstd)
            np.multiply(scale, invstd, out=a)
            np.multiply(out3, a3, out=out3)
            np.add(out3, bias3, out=out3)
            # Running averages (unbiased variance, as PyTorch).
            np.multiply(rmean, 1 - mom, out=rmean)
            np.add(rmean, mom * mean, out=rmean)
            np.multiply(rvar, 1 - mom, out=rvar)
            np.add(rvar, (mom * unbiased) * var, out=rvar)

        return compute


class BatchNormGrad(Kernel):
    op = OpCode.BATCH_NORM_GRAD
    num_inputs = (5, 5)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x = self.require_float(0), self.require_float(1)
        if g.shape != x.shape:
            raise self.fail(f"gradient shape {list(g.shape)} differs from x's {list(x.shape)}")
        _check_channels(self, x, 2, 5)
        self.training = bool(attrs.int("training", 1))
        self.epsilon = attrs.float("epsilon", 1e-5)
        self.axes = (0, *range(2, x.rank))
        self.count = x.size // x.shape[1]
        c = (x.shape[1],)
        self.output_specs = [
            TensorSpec(x.shape, x.dtype),
            TensorSpec(c, x.dtype),
            TensorSpec(c, x.dtype),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, scale, stat1, stat2 = inputs
        dx = outputs[0]
        n, c = x.shape[:2]
        dscale = outputs[1] if len(outputs) > 1 else np.empty(c, x.dtype)
        dbias = outputs[2] if len(outputs) > 2 else np.empty(c, x.dtype)
        g3, x3, dx3 = g.reshape(n, c, -1), x.reshape(n, c, -1), dx.reshape(n, c, -1)
        ones = np.ones(x3.shape[2], x.dtype)
        partial = np.empty((n, c), x.dtype)
        xc = np.empty_like(x3)
        invstd, coef, k_xc, k_const = (np.empty(c, x.dtype) for _ in range(4))
        mean3, coef3 = stat1.reshape(c, 1), coef.reshape(c, 1)
        k_xc3, k_const3 = k_xc.reshape(c, 1), k_const.reshape(c, 1)
        count, eps, training = self.count, self.epsilon, self.training

        def compute() -> None:
            if training:
                np.copyto(invstd, stat2)
            else:
                np.add(stat2, eps, out=invstd)
                np.sqrt(invstd, out=invstd)
                np.reciprocal(invstd, out=invstd)
            np.subtract(x3, mean3, out=xc)  # x - mean; xhat = xc * invstd
            np.matmul(g3, ones, out=partial)
            np.sum(partial, axis=0, out=dbias)
            np.einsum("nck,nck->c", g3, xc, out=dscale)
            np.multiply(dscale, invstd, out=dscale)
            np.multiply(scale, invstd, out=coef)
            np.multiply(g3, coef3, out=dx3)
            if training:
                # dx = coef * (g - dbias / M - xhat * dscale / M), xhat = xc * invstd
                np.multiply(coef, invstd, out=k_xc)
                np.multiply(k_xc, dscale, out=k_xc)
                np.multiply(k_xc, -1.0 / count, out=k_xc)
                np.multiply(coef, dbias, out=k_const)
                np.multiply(k_const, -1.0 / count, out=k_const)
                np.multiply(xc, k_xc3, out=xc)
                np.add(dx3, xc, out=dx3)
                np.add(dx3, k_const3, out=dx3)

        return compute


class LayerNormGrad(Kernel):
    op = OpCode.LAYER_NORM_GRAD
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x, scale = self.require_float(0), self.require_float(1), self.input(2)
        if g.shape != x.shape:
            raise self.fail(f"gradient shape {list(g.shape)} differs from x's {list(x.shape)}")
        if x.rank == 0:
            raise self.fail("x must have rank >= 1")
        axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        self.axes = tuple(range(axis, x.rank))
        self.lead = tuple(range(axis))
        self.epsilon = attrs.float("epsilon", 1e-5)
        normalized = x.shape[axis:]
        try:
            ok = np.broadcast_shapes(normalized, scale.shape) == normalized
        except ValueError:
            ok = False
        if not ok:
            raise self.fail(
                f"scale of shape {list(scale.shape)} does not broadcast to the "
                f"normalized shape {list(normalized)}"
            )
        self.count = int(np.prod(normalized, dtype=np.int64))
        self.stat_shape = x.shape[:axis] + (1,) * len(self.axes)
        self.output_specs = [
            TensorSpec(x.shape, x.dtype),
            TensorSpec(normalized, x.dtype),
            TensorSpec(normalized, x.dtype),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, scale = inputs
        dx = outputs[0]
        normalized = self.output_specs[1].shape
        dscale = outputs[1] if len(outputs) > 1 else np.empty(normalized, x.dtype)
        dbias = outputs[2] if len(outputs) > 2 else np.empty(normalized, x.dtype)
        mean = np.empty(self.stat_shape, x.dtype)
        invstd = np.empty(self.stat_shape, x.dtype)
        m1 = np.empty(self.stat_shape, x.dtype)
        m2 = np.empty(self.stat_shape, x.dtype)
        xhat, dxhat = np.empty_like(dx), np.empty_like(dx)
        axes, lead, eps = self.axes, self.lead, self.epsilon

        def compute() -> None:
            np.mean(x, axis=axes, keepdims=True, out=mean)
            np.subtract(x, mean, out=xhat)
            np.square(xhat, out=dxhat)
            np.mean(dxhat, axis=axes, keepdims=True, out=invstd)
            np.add(invstd, eps, out=invstd)
            np.sqrt(invstd, out=invstd)
            np.reciprocal(invstd, out=invstd)
            np.multiply(xhat, invstd, out=xhat)
            np.multiply(g, xhat, out=dxhat)
            np.sum(dxhat, axis=lead, out=dscale)
            np.sum(g, axis=lead, out=dbias)
            # dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
            np.multiply(g, scale, out=dxhat)
            np.mean(dxhat, axis=axes, keepdims=True, out=m1)
            np.multiply(dxhat, xhat, out=dx)
            np.mean(dx, axis=axes, keepdims=True, out=m2)
            np.multiply(xhat, m2, out=dx)
            np.subtract(dxhat, dx, out=dx)
            np.subtract(dx, m1, out=dx)
            np.multiply(dx, invstd, out=dx)

        return compute
