"""Reductions with ONNX semantics: ReduceMean/Sum/Max/Min/Prod and ArgMax/ArgMin.

Reduce*: `axes` as an attribute or a constant input 1 (opset 13/18 moved it), `keepdims`
(default 1) and `noop_with_empty_axes` (default 0: no axes reduces everything; 1: no axes
is the identity). ArgMax/ArgMin: `axis`, `keepdims`, `select_last_index`; int64 output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from sporenet.lite.kernels.axes import ints_arg, normalize_axes, normalize_axis
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode


class ReduceKernel(Kernel):
    """out = reduce(x, axes); subclasses name the NumPy reduction."""

    reduction: ClassVar[Callable[..., np.ndarray]]
    num_inputs = (1, 2)
    float_only: ClassVar[bool] = False
    # Max/Min: bool inputs too (False < True), and the value of an empty reduction is the
    # dtype's lowest (Max) or highest (Min) value, infinities for floats, as ONNX says.
    extreme: ClassVar[str | None] = None
    # Max/Min: the binary ufunc that gives the same value in any order, for a short last
    # axis (see short_last_axis).
    pairwise: ClassVar[np.ufunc | None] = None

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0) if self.float_only else self.input(0)
        if x.dtype.kind not in ("iufb" if self.extreme else "iuf"):
            raise self.fail(f"input must be a number tensor, got {x.dtype}")
        keepdims = bool(attrs.int("keepdims", 1))
        axes = ints_arg(self, 1, "axes")
        self.identity = False
        if not axes:
            if attrs.int("noop_with_empty_axes", 0):
                self.identity = True
                self.output_specs = [TensorSpec(x.shape, x.dtype)]
                return
            axes = list(range(x.rank))
        self.axes = tuple(sorted(normalize_axes(self, axes, x.rank)))
        self.initial = None if self.extreme is None else _extreme(x.dtype, self.extreme)
        self.keepdims = keepdims
        if keepdims:
            shape = tuple(1 if d in self.axes else n for d, n in enumerate(x.shape))
        else:
            shape = tuple(n for d, n in enumerate(x.shape) if d not in self.axes)
        self.output_specs = [TensorSpec(shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        if self.identity:
            return lambda: np.copyto(out, x)
        f, axes, keepdims, initial = self.reduction, self.axes, self.keepdims, self.initial
        pairwise = self.pairwise
        if pairwise is not None and short_last_axis(x.shape, axes):
            return slice_by_slice(pairwise, x, out)
        if initial is not None:
            return lambda: f(x, axis=axes, keepdims=keepdims, out=out, initial=initial)
        return lambda: f(x, axis=axes, keepdims=keepdims, out=out)


def short_last_axis(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """Whether the reduction is over the last axis only, of a few values in each of many
    rows: NumPy then reduces row by row with a per-row cost far above the work, and a few
    whole-array binary ufuncs over the axis' slices run tens of times faster."""
    if axes != (len(shape) - 1,):
        return False
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return 2 <= shape[-1] <= 16 and rows >= 16


def slice_by_slice(f: np.ufunc, x: np.ndarray, out: np.ndarray) -> Compute:
    """The step out = f(...f(f(x[..., 0], x[..., 1]), x[..., 2])..., x[..., k-1])."""
    flat = out[..., 0] if out.ndim == x.ndim else out  # keepdims: a view without the 1
    first, second, *rest = (x[..., i] for i in range(x.shape[-1]))

    def compute() -> None:
        f(first, second, out=flat)
        for part in rest:
            f(flat, part, out=flat)

    return compute


def _extreme(dtype: np.dtype, which: str) -> object:
    """The lowest ("min") or highest ("max") value of a dtype: an identity for Max/Min."""
    if dtype.kind == "b":
        return which == "max"
    if dtype.kind == "f":
        return np.inf if which == "max" else -np.inf
    info = np.iinfo(dtype)
    return info.max if which == "max" else info.min


class ReduceMean(ReduceKernel):
    op = OpCode.REDUCE_MEAN
    reduction = staticmethod(np.mean)
    float_only = True  # an integer mean would need a rounding rule ONNX leaves open

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        if self.identity or x.dtype not in (np.float32, np.float64) or not x.size:
            return super().bind(inputs, outputs)
        # np.mean's own steps without its Python wrapper, which costs as much as the work
        # on a layer norm's short rows: the same sum, divided by the same count.
        reduce, divide = np.add.reduce, np.true_divide
        axes, keepdims = self.axes, self.keepdims
        # A 0-d divisor: a NumPy scalar operand costs a conversion on every call.
        count = np.array(x.size // max(out.size, 1), x.dtype)

        def mean() -> None:
            reduce(x, axis=axes, keepdims=keepdims, out=out)
            divide(out, count, out=out)

        return mean


class ReduceSum(ReduceKernel):
    op = OpCode.REDUCE_SUM
    reduction = staticmethod(np.sum)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        axes = () if self.identity else self.axes
        if (
            len(axes) < 2
            or axes[0] != 0
            or len(axes) == x.ndim
            or x.shape[0] < 2
            or x.dtype.kind != "f"
            or not x.flags.c_contiguous
        ):
            return super().bind(inputs, outputs)
        # The batch axis first, as whole rows added at memory speed, then the rest on the
        # one summed sample: np.sum over (0, 2, 3) of an NCHW gradient (a conv bias's)
        # walks short rows across the batch instead.
        rows = temporary(x.shape[1:], x.dtype)
        flat, first = x.reshape(x.shape[0], -1), rows.reshape(-1)
        rest = tuple(a - 1 for a in axes[1:])
        target = out.reshape(out.shape[1:]) if self.keepdims else out
        reduce, keepdims = np.add.reduce, self.keepdims

        def two_stage() -> None:
            reduce(flat, axis=0, out=first)
            reduce(rows, axis=rest, keepdims=keepdims, out=target)

        return two_stage


class ReduceMax(ReduceKernel):
    op = OpCode.REDUCE_MAX
    reduction = staticmethod(np.max)
    extreme = "min"
    pairwise = np.maximum


class ReduceMin(ReduceKernel):
    op = OpCode.REDUCE_MIN
    reduction = staticmethod(np.min)
    extreme = "max"
    pairwise = np.minimum


class ReduceProd(ReduceKernel):
    op = OpCode.REDUCE_PROD
    reduction = staticmethod(np.prod)


class ArgKernel(Kernel):
    """Index of the extreme value along `axis` (first, or last with select_last_index)."""

    find: ClassVar[Callable[..., np.ndarray]]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.dtype.kind not in "iuf":
            raise self.fail(f"input must be a number tensor, got {x.dtype}")
        if x.rank == 0:
            raise self.fail("input must have rank >= 1, got a scalar")
        self.axis = normalize_axis(self, attrs.int("axis", 0), x.rank)
        if x.shape[self.axis] == 0:
            raise self.fail(
                f"axis {self.axis} of shape {list(x.shape)} is empty: no index to return"
            )
        self.keepdims = bool(attrs.int("keepdims", 1))
        self.last = bool(attrs.int("select_last_index", 0))
        shape = list(x.shape)
        if self.keepdims:
            shape[self.axis] = 1
        else:
            del shape[self.axis]
        self.output_specs = [TensorSpec(tuple(shape), np.dtype(np.int64))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, axis, keepdims, f = (
            required(inputs, 0),
            outputs[0],
            self.axis,
            self.keepdims,
            self.find,
        )
        if not self.last:
            return lambda: f(x, axis=axis, keepdims=keepdims, out=out)
        # The last extreme is the first one of the reversed axis, counted from the end.
        index = (slice(None),) * axis + (slice(None, None, -1),)
        reversed_x = x[index]
        top = x.shape[axis] - 1

        def compute() -> None:
            f(reversed_x, axis=axis, keepdims=keepdims, out=out)
            np.subtract(top, out, out=out)

        return compute


class ArgMax(ArgKernel):
    op = OpCode.ARGMAX
    find = staticmethod(np.argmax)


class ArgMin(ArgKernel):
    op = OpCode.ARGMIN
    find = staticmethod(np.argmin)
