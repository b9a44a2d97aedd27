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
            raise kernel.fail(f"input {k} must be {x.dtype}[{x.shape[1]}] (one value per "
                              f"channel), got {spec.dtype}{list(spec.shape)}")


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
        self.output_specs = [TensorSpec(x.shape, x.dtype), TensorSpec(c, x.dtype),
                             TensorSpec(c, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, scale, bias, rmean, rvar = inputs
        out = outputs[0]
        c = x.shape[1]
        bshape = (c,) + (1,) * (x.ndim - 2)
        mean = outputs[1] if len(outputs) > 1 else np.empty(c, x.dtype)
        invstd = outputs[2] if len(outputs) > 2 else np.empty(c, x.dtype)
        var = np.empty(c, x.dtype)
        sq = np.empty_like(out)
        axes, eps, mom, count = self.axes, self.epsilon, self.momentum, self.count
        mean_b, invstd_b = mean.reshape(bshape), invstd.reshape(bshape)
        scale_b, bias_b = scale.reshape(bshape), bias.reshape(bshape)

        def compute() -> None:
            np.mean(x, axis=axes, out=mean)
            np.subtract(x, mean_b, out=out)
            np.square(out, out=sq)
            np.mean(sq, axis=axes, out=var)
            np.add(var, eps, out=invstd)
            np.sqrt(invstd, out=invstd)
            np.reciprocal(invstd, out=invstd)
            np.multiply(out, invstd_b, out=out)
            np.multiply(out, scale_b, out=out)
            np.add(out, bias_b, out=out)
            # Running averages (unbiased variance, as PyTorch).
            np.multiply(rmean, 1 - mom, out=rmean)
            np.add(rmean, mom * mean, out=rmean)
            np.multiply(rvar, 1 - mom, out=rvar)
            np.add(rvar, mom * count / max(count - 1, 1) * var, out=rvar)

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
        self.output_specs = [TensorSpec(x.shape, x.dtype), TensorSpec(c, x.dtype),
                             TensorSpec(c, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, scale, stat1, stat2 = inputs
        dx = outputs[0]
        c = x.shape[1]
        dscale = outputs[1] if len(outputs) > 1 else np.empty(c, x.dtype)
        dbias = outputs[2] if len(outputs) > 2 else np.empty(c, x.dtype)
        bshape = (c,) + (1,) * (x.ndim - 2)
        invstd = np.empty(c, x.dtype)
        coef = np.empty(c, x.dtype)
        xhat = np.empty_like(dx)
        axes, count, eps, training = self.axes, self.count, self.epsilon, self.training
        mean_b, invstd_b, coef_b = stat1.reshape(bshape), invstd.reshape(bshape), coef.reshape(
            bshape)
        dscale_b, dbias_b = dscale.reshape(bshape), dbias.reshape(bshape)

        def compute() -> None:
            if training:
                np.copyto(invstd, stat2)
            else:
                np.add(stat2, eps, out=invstd)
                np.sqrt(invstd, out=invstd)
                np.reciprocal(invstd, out=invstd)
            np.subtract(x, mean_b, out=xhat)
            np.multiply(xhat, invstd_b, out=xhat)
            np.sum(g, axis=axes, out=dbias)
            np.multiply(g, xhat, out=dx)
            np.sum(dx, axis=axes, out=dscale)
            np.multiply(scale, invstd, out=coef)
            if training:
                # dx = scale * invstd * (g - mean(g) - xhat * mean(g * xhat))
                np.multiply(xhat, dscale_b, out=dx)
                np.multiply(dx, 1.0 / count, out=dx)
                np.subtract(g, dx, out=dx)
                np.subtract(dx, dbias_b * (1.0 / count), out=dx)
                np.multiply(dx, coef_b, out=dx)
            else:
                np.multiply(g, coef_b, out=dx)

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
            raise self.fail(f"scale of shape {list(scale.shape)} does not broadcast to the "
                            f"normalized shape {list(normalized)}")
        self.count = int(np.prod(normalized, dtype=np.int64))
        self.stat_shape = x.shape[:axis] + (1,) * len(self.axes)
        self.output_specs = [TensorSpec(x.shape, x.dtype), TensorSpec(normalized, x.dtype),
                             TensorSpec(normalized, x.dtype)]

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
