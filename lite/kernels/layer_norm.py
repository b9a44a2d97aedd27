"""LayerNorm with ONNX LayerNormalization semantics (opset 17).

Normalizes over axes [axis, rank): y = (x - mean) / sqrt(var + epsilon) * scale + bias.
Optional outputs 1 and 2 are the mean and the inverse standard deviation, shaped like x
with the normalized axes set to 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.lite.kernels import raw
from sporenet.lite.kernels.axes import normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.elementwise import same_shape
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode


class LayerNorm(Kernel):
    op = OpCode.LAYER_NORM
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        if x.rank == 0:
            raise self.fail("input must have rank >= 1, got a scalar")
        axis = normalize_axis(self, attrs.int("axis", -1), x.rank)
        self.axes = tuple(range(axis, x.rank))
        self.epsilon = attrs.float("epsilon", 1e-5)
        if not self.epsilon >= 0:
            raise self.fail(f"epsilon must be >= 0, got {self.epsilon}")
        normalized = x.shape[axis:]
        for k, name in ((1, "scale"), (2, "bias")):
            spec = self.input(k) if k == 1 else self.optional_input(k)
            if spec is None:
                continue
            if spec.dtype != x.dtype:
                raise self.fail(f"{name} must be {x.dtype} like x, got {spec.dtype}")
            try:
                ok = np.broadcast_shapes(normalized, spec.shape) == normalized
            except ValueError:
                ok = False
            if not ok:
                raise self.fail(
                    f"{name} of shape {list(spec.shape)} does not broadcast to the "
                    f"normalized shape {list(normalized)} (axes {list(self.axes)} "
                    f"of x {list(x.shape)})"
                )
        stat_shape = x.shape[:axis] + (1,) * len(self.axes)
        self.output_specs = [
            TensorSpec(x.shape, x.dtype),
            TensorSpec(stat_shape, x.dtype),
            TensorSpec(stat_shape, x.dtype),
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, scale = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        out, axes, eps = outputs[0], self.axes, self.epsilon
        stat = self.output_specs[1]
        mean = outputs[1] if len(outputs) > 1 else np.empty(stat.shape, stat.dtype)
        inv_std = outputs[2] if len(outputs) > 2 else np.empty(stat.shape, stat.dtype)
        if mean.size == 1 and x is not None and scale is not None and _flat(x, out, mean, inv_std):
            return _one_row(x, scale, bias, out, mean, inv_std, eps)
        sq = temporary(out.shape, out.dtype)  # rewritten every call: from the plan's arena
        # np.mean's own steps (the sum, then the division by the count) without its Python
        # wrapper, which costs as much as the work on a transformer's short rows.
        total, divide = np.add.reduce, np.true_divide
        count = out.dtype.type(out.size // max(mean.size, 1))

        def compute() -> None:
            total(x, axis=axes, keepdims=True, out=mean)
            divide(mean, count, out=mean)
            np.subtract(x, mean, out=out)
            np.square(out, out=sq)
            total(sq, axis=axes, keepdims=True, out=inv_std)
            divide(inv_std, count, out=inv_std)
            np.add(inv_std, eps, out=inv_std)
            np.sqrt(inv_std, out=inv_std)
            np.reciprocal(inv_std, out=inv_std)
            np.multiply(out, inv_std, out=out)
            np.multiply(out, scale, out=out)
            if bias is not None:
                np.add(out, bias, out=out)

        return compute


def _flat(*arrays: np.ndarray) -> bool:
    """Whether every array is C-contiguous (so a reshape is a view)."""
    return all(a.flags.c_contiguous for a in arrays)


def _inv_sqrt(v: float) -> float:
    """1 / sqrt(v) with IEEE's results at 0 (inf) and for NaN."""
    if v > 0.0:
        return 1.0 / math.sqrt(v)
    return math.inf if v == 0.0 else math.nan


def _one_row(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None,
    out: np.ndarray,
    mean: np.ndarray,
    inv_std: np.ndarray,
    eps: float,
) -> Compute:
    """The step for one normalized row (a wake-word head's 32 to 128 features): its
    statistics are single numbers, so the variance is one dot product of the centered
    row with itself and 1 / sqrt(var / n + eps) is Python float64 arithmetic, rounded
    once to the dtype, where the array form makes eight calls, each costing more than
    the row's arithmetic. The mean is np.mean's float32 sum and division, as above."""
    n = out.size
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    # The row's parameters as views of its shape: a 1-D scale against a (1, C) row is a
    # broadcast NumPy sets up on every call.
    scale = same_shape(scale, out)
    bias = None if bias is None else same_shape(bias, out)
    m0, v0 = mean.reshape(()), inv_std.reshape(())
    count = np.array(out.dtype.type(n))
    total: Any = np.add.reduce  # positional outputs, which NumPy's stubs do not list
    divide, subtract, multiply, add = np.true_divide, np.subtract, np.multiply, np.add
    dot = raw.dot

    if out.dtype in _IEEE_SCALARS:
        # The division as a NumPy scalar's: the same correctly rounded quotient without
        # a ufunc call, written once into the 0-d mean the subtraction reads.
        count_scalar, fill_mean = out.dtype.type(n), m0.fill

        def average() -> None:
            fill_mean(total(flat_x, 0) / count_scalar)

    else:

        def average() -> None:
            total(flat_x, 0, None, m0)
            divide(m0, count, m0)

    def compute() -> None:
        average()
        subtract(flat_x, m0, flat_out)
        v0.fill(_inv_sqrt(float(dot(flat_out, flat_out)) / n + eps))
        multiply(flat_out, v0, flat_out)
        multiply(out, scale, out)
        if bias is not None:
            add(out, bias, out)

    return compute


_IEEE_SCALARS = (np.dtype(np.float32), np.dtype(np.float64))
"""Dtypes whose NumPy scalar division is the IEEE quotient the divide ufunc gives."""
