"""Gradients of broadcasting: sum a gradient back to an input's shape, or spread it out.

REDUCE_SUM_TO(g, like) sums `g` over the axes NumPy broadcasting added or stretched so the
result has `like`'s shape (the gradient of any broadcasting binary op). REDUCE_GRAD(g, x)
is the gradient of ReduceSum/ReduceMean: `g` broadcast back to x's shape (divided by the
number of reduced elements for a mean).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.ops import OpCode


def sum_to_axes(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    """Axes of `shape` to sum so it becomes `target`, or None if `target` does not broadcast
    to `shape`."""
    lead = len(shape) - len(target)
    if lead < 0:
        return None
    axes = list(range(lead))
    for k, (s, t) in enumerate(zip(shape[lead:], target, strict=True)):
        if t == 1 and s != 1:
            axes.append(lead + k)
        elif t != s:
            return None
    return tuple(axes)


class ReduceSumTo(Kernel):
    """out (shaped like input 1) = input 0 summed over its broadcast axes."""

    op = OpCode.REDUCE_SUM_TO
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, like = self.input(0), self.input(1)
        axes = sum_to_axes(g.shape, like.shape)
        if axes is None:
            raise self.fail(
                f"shape {list(like.shape)} does not broadcast to the gradient's "
                f"shape {list(g.shape)}"
            )
        self.axes = axes
        # Same shape: nothing to sum, the output is the gradient itself.
        self.is_view = not axes
        self.output_specs = [TensorSpec(like.shape, g.dtype)]
        # np.sum without keepdims drops the summed axes; this is `out` viewed that way.
        self.reduced_shape = tuple(d for k, d in enumerate(g.shape) if k not in axes)

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [inputs[0].reshape(self.output_specs[0].shape)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, axes = inputs[0], self.axes
        out = outputs[0].reshape(self.reduced_shape)
        return lambda: np.sum(g, axis=axes, out=out)


class ReduceGrad(Kernel):
    """out (shaped like x) = g broadcast over the reduced `axes` (scaled by 1/count for a mean).

    Attributes mirror the forward reduction: `axes` (empty: all), `keepdims`, and
    `reduction` ("sum" or "mean").
    """

    op = OpCode.REDUCE_GRAD
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x = self.input(0), self.input(1)
        rank = x.rank
        axes = attrs.ints("axes", [])
        if any(not -rank <= a < max(rank, 1) for a in axes):
            raise self.fail(f"axes {axes} out of range for rank {rank}")
        axes = sorted({a % rank for a in axes}) if rank else []
        if not axes:
            axes = list(range(rank))
        keepdims = bool(attrs.int("keepdims", 1))
        reduction = attrs.str("reduction", "sum")
        if reduction not in ("sum", "mean"):
            raise self.fail(f"attribute 'reduction' must be 'sum' or 'mean', got {reduction!r}")
        kept = tuple(1 if k in axes else d for k, d in enumerate(x.shape))
        expected = kept if keepdims else tuple(d for k, d in enumerate(x.shape) if k not in axes)
        if int(np.prod(g.shape, dtype=np.int64)) != int(np.prod(expected, dtype=np.int64)):
            raise self.fail(
                f"gradient shape {list(g.shape)} does not match the reduced shape "
                f"{list(expected)} of x {list(x.shape)} over axes {axes}"
            )
        self.kept = kept
        count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
        self.scale = 1.0 / max(count, 1) if reduction == "mean" else 1.0
        self.output_specs = [TensorSpec(x.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, out, scale = inputs[0].reshape(self.kept), outputs[0], self.scale
        if scale == 1.0:
            return lambda: np.copyto(out, g)

        def compute() -> None:
            np.copyto(out, g)
            np.multiply(out, scale, out=out)

        return compute
