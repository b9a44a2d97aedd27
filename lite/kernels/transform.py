"""Data-movement kernels with ONNX semantics: Concat, Split, Slice, Gather, Transpose,
Squeeze, Unsqueeze, Expand, Tile, Cast, Where, Shape, DepthToSpace, SpaceToDepth.

Squeeze and Unsqueeze are reshape views (no copy, no run step). The others copy into the
planner's output arrays; where the source is a fixed view of the input (a slice, a
transpose, a broadcast) that view is built once in `bind`, so a run is one `raw.copyto`.
Output arrays handed to `bind` are C-contiguous (the planner allocates them), so reshaping
an output is always a view.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite import lowp
from sporenet.lite.kernels import raw
from sporenet.lite.kernels.axes import ints_arg, normalize_axes, normalize_axis
from sporenet.lite.kernels.base import (
    REQUIRED,
    Attrs,
    ChannelsLast,
    Compute,
    Kernel,
    TensorSpec,
    required,
)
from sporenet.lite.kernels.conv_common import is_channels_last
from sporenet.lite.kernels.reshape import ViewKernel
from sporenet.lite.ops import OpCode


def _copy(out: np.ndarray, source: np.ndarray) -> Compute:
    return lambda: raw.copyto(out, source)


def _aliased(kernel: Kernel, x: np.ndarray, view: np.ndarray) -> np.ndarray:
    """`view` of `x` for a movement kernel that runs as a view: it must share x's memory
    and be C-contiguous, as it is when x is (the planner stores the input of a kernel
    refusing channels-last so); anything else is a planning bug, said as such."""
    if not (view.flags.c_contiguous and np.may_share_memory(view, x)):
        raise kernel.fail(
            f"runs as a view of its input, which needs a C-contiguous input; got strides "
            f"{x.strides} for shape {list(x.shape)}"
        )
    return view


VIEW_SLICE_BYTES = 64 << 10
"""Inputs up to this size may stay alive behind a view of a small part of them."""


def contiguous_slice(shape: Sequence[int], out: Sequence[int], steps: Sequence[int]) -> bool:
    """Whether slicing a C-contiguous array of `shape` to `out` (with these steps per
    axis) leaves one contiguous block: inside the last partial axis every axis is whole,
    outside it every axis has one element."""
    outer_units = False  # a partial axis was seen: every axis outside it must be 1 long
    for n, m, step in zip(reversed(shape), reversed(out), reversed(steps), strict=True):
        if n == 1:
            continue
        if m == 1:
            outer_units = True
            continue
        if outer_units or step != 1 or m == 0:
            return False
        outer_units = m != n
    return True


# --------------------------------------------------------------------------- joining, splitting


class Concat(Kernel):
    """Join inputs along `axis`; all other dimensions and the dtype must match."""

    op = OpCode.CONCAT
    num_inputs = (1, 1 << 16)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        specs = [self.input(k) for k in range(len(inputs))]
        first = specs[0]
        if first.rank == 0:
            raise self.fail("inputs must have rank >= 1, got a scalar")
        self.axis = normalize_axis(self, attrs.int("axis", REQUIRED), first.rank)
        total = 0
        for k, s in enumerate(specs):
            if s.dtype != first.dtype:
                raise self.fail(f"input {k} is {s.dtype}, input 0 is {first.dtype}")
            same = s.rank == first.rank and all(
                a == b
                for d, (a, b) in enumerate(zip(s.shape, first.shape, strict=False))
                if d != self.axis
            )
            if not same:
                raise self.fail(
                    f"input {k} has shape {list(s.shape)}, which does not match "
                    f"input 0 {list(first.shape)} outside axis {self.axis}"
                )
            total += s.shape[self.axis]
        shape = list(first.shape)
        shape[self.axis] = total
        self.output_specs = [TensorSpec(tuple(shape), first.dtype)]
        self.offsets = np.cumsum([0] + [s.shape[self.axis] for s in specs]).tolist()

    def output_region(self, index: int) -> tuple[slice, ...]:
        start, stop = self.offsets[index], self.offsets[index + 1]
        return (slice(None),) * self.axis + (slice(start, stop),)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute | None:
        ins = tuple(required(inputs, k) for k in range(len(inputs)))
        out, axis = outputs[0], self.axis
        regions = [out[self.output_region(k)] for k in range(len(ins))]
        placed = [_in_place(x, r) for x, r in zip(ins, regions, strict=True)]
        if not any(placed):
            return lambda: raw.concatenate(ins, axis=axis, out=out)
        # Inputs the planner stored in their region are there already; the others are
        # copied into theirs (an input inside its region in another order, a transposing
        # view, is copied with NumPy's overlap handling).
        copies = [(r, x) for x, r, done in zip(ins, regions, placed, strict=True) if not done]
        if not copies:
            return None
        if len(copies) == 1:
            return _copy(*copies[0])
        copyto = raw.copyto

        def compute() -> None:
            for region, x in copies:
                copyto(region, x)

        return compute


def _in_place(x: np.ndarray, region: np.ndarray) -> bool:
    """Whether `x` is `region` itself: the same C-contiguous memory in the same order."""
    return (
        x.shape == region.shape
        and x.flags.c_contiguous
        and region.flags.c_contiguous
        and (x.size == 0 or x.ctypes.data == region.ctypes.data)
    )


class Split(Kernel):
    """Split along `axis` into the sizes of `split` (attribute or constant input 1), or into
    `num_outputs` (attribute, else the node's output count) parts; with parts that do not
    divide the axis, the last part is smaller (ONNX opset 18)."""

    op = OpCode.SPLIT
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        if x.rank == 0:
            raise self.fail("input must have rank >= 1, got a scalar")
        self.axis = normalize_axis(self, attrs.int("axis", 0), x.rank)
        dim = x.shape[self.axis]
        sizes = ints_arg(self, 1, "split")
        if sizes is not None:
            if len(sizes) != attrs.num_outputs:
                raise self.fail(
                    f"split {sizes} has {len(sizes)} parts but the node lists "
                    f"{attrs.num_outputs} outputs"
                )
            if any(s < 0 for s in sizes) or sum(sizes) != dim:
                raise self.fail(
                    f"split {sizes} must be non-negative and sum to axis {self.axis}'s size {dim}"
                )
        else:
            n = attrs.int("num_outputs", attrs.num_outputs)
            if n < 1 or n != attrs.num_outputs:
                raise self.fail(
                    f"num_outputs {n} must be >= 1 and equal the node's {attrs.num_outputs} outputs"
                )
            chunk = -(-dim // n)
            sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
            if sizes[-1] < 0 or (n > 1 and sizes[-1] == 0 and dim % n):
                raise self.fail(f"cannot split axis {self.axis} of size {dim} into {n} parts")
        self.slices: list[tuple[slice, ...]] = []
        start = 0
        for size in sizes:
            index = [slice(None)] * x.rank
            index[self.axis] = slice(start, start + size)
            self.slices.append(tuple(index))
            start += size
        self.output_specs = [
            TensorSpec((*x.shape[: self.axis], s, *x.shape[self.axis + 1 :]), x.dtype)
            for s in sizes
        ]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = inputs[0]
        pairs = [(out, x[index]) for out, index in zip(outputs, self.slices, strict=False)]

        def compute() -> None:
            for out, part in pairs:
                raw.copyto(out, part)

        return compute


# --------------------------------------------------------------------------- indexing


class Slice(Kernel):
    """x[starts:ends:steps] on `axes`, with ONNX's clamping of out-of-range bounds.

    starts/ends/axes/steps come as constant inputs 1..4 (opset >= 10) or as attributes.
    """

    op = OpCode.SLICE
    num_inputs = (1, 5)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        starts = ints_arg(self, 1, "starts")
        ends = ints_arg(self, 2, "ends")
        if starts is None or ends is None:
            raise self.fail("needs starts and ends (attributes or constant inputs 1 and 2)")
        axes = ints_arg(self, 3, "axes")
        steps = ints_arg(self, 4, "steps")
        if axes is None:
            axes = list(range(len(starts)))
        if steps is None:
            steps = [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise self.fail(
                f"starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                "must have the same length"
            )
        axes = normalize_axes(self, axes, x.rank)
        index = [slice(None)] * x.rank
        shape = list(x.shape)
        for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
            dim = x.shape[axis]
            if step == 0:
                raise self.fail(f"step for axis {axis} must not be 0")
            if start < 0:
                start += dim
            if end < 0:
                end += dim
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
                length = max(0, -(-(end - start) // step))
            else:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
                length = max(0, -(-(start - end) // -step))
            # A negative step's end of -1 means "through index 0", which Python spells None.
            index[axis] = slice(start, None if end < 0 else end, step)
            shape[axis] = length
        self.index = tuple(index)
        self.output_specs = [TensorSpec(tuple(shape), x.dtype)]
        # A slice that is one contiguous block of its input is a view: no copy, no step
        # (a streaming model's state windows). A view keeps its whole input alive, so only
        # one holding at least half of it, or of a small input, is made so.
        steps_per_axis = [s.step or 1 for s in self.index]
        size, total = int(np.prod(shape)), x.size
        self.is_view = (
            x.dtype != object
            and (2 * size >= total or total * x.dtype.itemsize <= VIEW_SLICE_BYTES)
            and contiguous_slice(x.shape, shape, steps_per_axis)
        )

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(inputs, 0)
        return [_aliased(self, x, x[self.index])]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return _copy(outputs[0], required(inputs, 0)[self.index])


class Gather(Kernel):
    """Take entries of `data` along `axis` at `indices` (int32/int64, negative from the end).

    Constant indices are range-checked and normalized when the model loads; run-time
    indices out of range raise IndexError from NumPy when the graph runs.
    """

    op = OpCode.GATHER
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        data, indices = self.input(0), self.input(1)
        if data.rank == 0:
            raise self.fail("data must have rank >= 1, got a scalar")
        if indices.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise self.fail(f"indices must be int32 or int64, got {indices.dtype}")
        self.axis = normalize_axis(self, attrs.int("axis", 0), data.rank)
        dim = data.shape[self.axis]
        self.indices: np.ndarray | None = None
        if indices.value is not None:
            idx = indices.value.astype(np.int64)
            bad = (idx < -dim) | (idx >= dim)
            if bad.any():
                raise self.fail(
                    f"index {int(idx[bad].flat[0])} is out of range for axis "
                    f"{self.axis} of size {dim} (expected {-dim}..{dim - 1})"
                )
            self.indices = np.where(idx < 0, idx + dim, idx).astype(np.intp)
        shape = data.shape[: self.axis] + indices.shape + data.shape[self.axis + 1 :]
        self.output_specs = [TensorSpec(shape, data.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        data, out, axis = required(inputs, 0), outputs[0], self.axis
        if self.indices is not None and self.indices.ndim == 0:
            # One constant index: the result is a fixed view of the data (the Ellipsis keeps
            # it a 0-d view when data is 1-D; a bare integer index would copy a scalar).
            index = (slice(None),) * axis + (int(self.indices), Ellipsis)
            return _copy(out, data[index])
        indices = self.indices if self.indices is not None else inputs[1]
        return lambda: np.take(data, indices, axis=axis, out=out)


# --------------------------------------------------------------------------- layout


class Transpose(Kernel):
    """Permute axes by `perm` (default: reversed)."""

    op = OpCode.TRANSPOSE

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        perm = attrs.ints("perm")
        if perm is None:
            perm = list(range(x.rank))[::-1]
        if sorted(perm) != list(range(x.rank)):
            raise self.fail(
                f"perm {perm} is not a permutation of 0..{x.rank - 1} (input shape {list(x.shape)})"
            )
        self.perm = tuple(perm)
        self.output_specs = [TensorSpec(tuple(x.shape[p] for p in perm), x.dtype)]
        # A permutation that keeps the axes longer than 1 in order moves only 1-long axes:
        # the memory order is unchanged, so the output is a reshaped view.
        wide = [p for p in perm if x.shape[p] != 1]
        self.reshapes = wide == sorted(wide) and x.dtype != object
        self.is_view = self.reshapes
        self.strided = False

    def view_strided(self, strided: bool) -> None:
        """Run as a transposing (strided) view, or as planned again: the planner sets it
        when every reader takes any strides (Kernel.reads_strided)."""
        self.strided = strided and not self.reshapes
        self.is_view = self.reshapes or self.strided

    def view(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(inputs, 0)
        if self.strided:
            return [x.transpose(self.perm)]
        return [_aliased(self, x, x.reshape(self.output_specs[0].shape))]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return _copy(outputs[0], required(inputs, 0).transpose(self.perm))


class Squeeze(ViewKernel):
    """Drop size-1 axes: `axes` (attribute or constant input 1), or every size-1 axis."""

    op = OpCode.SQUEEZE
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        axes = ints_arg(self, 1, "axes")
        if axes is None:
            drop = {d for d, n in enumerate(x.shape) if n == 1}
        else:
            drop = set(normalize_axes(self, axes, x.rank))
            wide = [d for d in sorted(drop) if x.shape[d] != 1]
            if wide:
                raise self.fail(
                    f"cannot squeeze axis {wide[0]} of size {x.shape[wide[0]]} "
                    f"(input shape {list(x.shape)})"
                )
        shape = tuple(n for d, n in enumerate(x.shape) if d not in drop)
        self.output_specs = [TensorSpec(shape, x.dtype)]


class Unsqueeze(ViewKernel):
    """Insert size-1 axes at `axes` (attribute or constant input 1), numbered in the output."""

    op = OpCode.UNSQUEEZE
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        axes = ints_arg(self, 1, "axes")
        if axes is None:
            raise self.fail("needs `axes` (attribute or constant input 1)")
        rank = x.rank + len(axes)
        inserted = set(normalize_axes(self, axes, rank))
        dims = iter(x.shape)
        shape = tuple(1 if d in inserted else next(dims) for d in range(rank))
        self.output_specs = [TensorSpec(shape, x.dtype)]


class Expand(Kernel):
    """Broadcast x against `shape` (constant input 1 or attribute), NumPy rules both ways."""

    op = OpCode.EXPAND
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        target = ints_arg(self, 1, "shape")
        if target is None:
            raise self.fail("needs `shape` (attribute or constant input 1)")
        if any(d < 0 for d in target):
            raise self.fail(f"shape {target} has a negative dimension")
        try:
            shape = np.broadcast_shapes(x.shape, tuple(target))
        except ValueError:
            raise self.fail(f"input shape {list(x.shape)} does not broadcast to {target}") from None
        self.output_specs = [TensorSpec(tuple(shape), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return _copy(outputs[0], required(inputs, 0))


class Tile(Kernel):
    """Repeat x `repeats[d]` times along each axis d (constant input 1 or attribute)."""

    op = OpCode.TILE
    num_inputs = (1, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        repeats = ints_arg(self, 1, "repeats")
        if repeats is None:
            raise self.fail("needs `repeats` (attribute or constant input 1)")
        if len(repeats) != x.rank or any(r < 0 for r in repeats):
            raise self.fail(
                f"repeats {repeats} must hold {x.rank} non-negative values, one "
                f"per axis of the input {list(x.shape)}"
            )
        self.repeats = tuple(repeats)
        shape = tuple(n * r for n, r in zip(x.shape, repeats, strict=True))
        self.output_specs = [TensorSpec(shape, x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        # out viewed as (r0, d0, r1, d1, ...) receives x viewed as (1, d0, 1, d1, ...).
        interleaved = tuple(v for r, n in zip(self.repeats, x.shape, strict=True) for v in (r, n))
        target = out.reshape(interleaved)
        source = x[(None, slice(None)) * x.ndim]
        return _copy(target, source)


# --------------------------------------------------------------------------- dtype, select, shape

# ONNX TensorProto.DataType codes for Cast's `to` (the converter passes them through).
ONNX_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
    16: lowp.BFLOAT16,
    17: lowp.FLOAT8E4M3FN,
    18: lowp.FLOAT8E4M3FNUZ,
    19: lowp.FLOAT8E5M2,
    20: lowp.FLOAT8E5M2FNUZ,
    21: lowp.UINT4,
    22: lowp.INT4,
    23: lowp.FLOAT4E2M1,
    24: lowp.FLOAT8E8M0,
    25: lowp.UINT2,
    26: lowp.INT2,
}


def _dtype_name(dtype: np.dtype) -> str:
    """A dtype's name as messages spell it: the low-precision type's for those NumPy lacks."""
    kind = lowp.lowp_type(dtype)
    return kind.name if kind is not None else str(dtype)


_DTYPE_NAMES = {_dtype_name(d): d for d in ONNX_DTYPES.values()}


def _bind_float_to_int(x: np.ndarray, out: np.ndarray) -> Compute:
    """A float to integer cast as onnxruntime's C cast gives it on the same CPU, NaN and
    values out of the target's range included (x86-64: the integer indefinite value, the
    type's minimum; a log(0) of a T5 position bucket meets it), without NumPy's warning
    about those values."""
    copyto, errstate = raw.copyto, np.errstate

    def compute() -> None:
        with errstate(invalid="ignore", over="ignore"):
            copyto(out, x, casting="unsafe")

    return compute


class Cast(Kernel):
    """Convert to dtype `to`: an ONNX TensorProto code (1 = float32, 7 = int64, ...) or a
    NumPy dtype name ("float32"). Float to int truncates toward zero, as C and ONNX do.
    Low-precision types (lite/lowp.py) go through float32 (or int8/uint8): `saturate` and
    `round_mode` are ONNX's attributes for the float8 targets."""

    op = OpCode.CAST

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        to = attrs.values.get("to")
        if isinstance(to, int | np.integer) and not isinstance(to, bool) and to in ONNX_DTYPES:
            dtype = ONNX_DTYPES[int(to)]
        elif isinstance(to, str) and to in _DTYPE_NAMES:
            dtype = _DTYPE_NAMES[to]
        else:
            raise self.fail(
                f"attribute 'to' must be one of the ONNX dtype codes "
                f"{sorted(ONNX_DTYPES)} or names {sorted(_DTYPE_NAMES)}, got {to!r}"
            )
        self.saturate = bool(attrs.int("saturate", 1))
        self.round_mode = attrs.str("round_mode", "up")
        if self.round_mode not in ("up", "down", "nearest"):
            raise self.fail(
                f"round_mode must be 'up', 'down' or 'nearest', got {self.round_mode!r}"
            )
        self.output_specs = [TensorSpec(x.shape, dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = required(inputs, 0), outputs[0]
        source, target = lowp.is_lowp(x.dtype), lowp.is_lowp(out.dtype)
        if not source and not target:
            if x.dtype.kind in "fc" and out.dtype.kind in "iub":
                return _bind_float_to_int(x, out)
            return lambda: raw.copyto(out, x, casting="unsafe")

        def compute() -> None:
            wide = lowp.decode(x) if source else x
            if target:
                narrow = lowp.encode(
                    wide, out.dtype, saturate=self.saturate, round_mode=self.round_mode
                )
                raw.copyto(out, narrow)
            else:
                raw.copyto(out, wide, casting="unsafe")

        return compute


class Where(Kernel):
    """cond ? x : y elementwise, the three broadcast together (cond is bool)."""

    op = OpCode.WHERE
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        cond, x, y = self.input(0), self.input(1), self.input(2)
        if cond.dtype != np.dtype(np.bool_):
            raise self.fail(f"condition must be bool, got {cond.dtype}")
        if x.dtype != y.dtype:
            raise self.fail(f"x and y must share a dtype, got {x.dtype} and {y.dtype}")
        shape = self.broadcast_shape(cond, x, y)
        self.output_specs = [TensorSpec(tuple(shape), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        cond, x, y, out = inputs[0], inputs[1], inputs[2], outputs[0]

        def compute() -> None:
            raw.copyto(out, y)
            raw.copyto(out, x, where=cond)

        return compute


class Shape(Kernel):
    """The input's shape as int64, optionally the dims [start, end) (ONNX opset 15)."""

    op = OpCode.SHAPE

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        start, end = attrs.int("start", 0), attrs.int("end", x.rank)
        # ONNX clamps both to [0, rank] after adding rank to negatives.
        start = min(max(start + x.rank if start < 0 else start, 0), x.rank)
        end = min(max(end + x.rank if end < 0 else end, 0), x.rank)
        self.value = np.array(x.shape[start:end], np.int64)
        self.value.flags.writeable = False
        # Known from the input's shape alone: the planner folds it (and what it feeds).
        self.output_specs = [TensorSpec(self.value.shape, self.value.dtype, self.value)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return _copy(outputs[0], self.value)


class DepthToSpace(Kernel):
    """NCHW: move blocks of channels into blocksize x blocksize spatial tiles (DCR or CRD)."""

    op = OpCode.DEPTH_TO_SPACE

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        b = attrs.int("blocksize", REQUIRED)
        self.mode = attrs.str("mode", "DCR")
        if self.mode not in ("DCR", "CRD"):
            raise self.fail(f"mode must be 'DCR' or 'CRD', got {self.mode!r}")
        if x.rank != 4 or b < 1 or x.shape[1] % (b * b):
            raise self.fail(
                f"needs an NCHW input whose channels divide by blocksize² "
                f"({b}²), got shape {list(x.shape)}"
            )
        n, c, h, w = x.shape
        self.b = b
        self.output_specs = [TensorSpec((n, c // (b * b), h * b, w * b), x.dtype)]

    # Layout: one copy between (N, C2, H, b, W, b) views of either storage; on
    # channels-last storage (TFLite's own layout) it moves runs of C2 elements.
    def channels_last_input(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED

    def channels_last_follows(self, index: int) -> int | None:
        return 0

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, b = required(inputs, 0), outputs[0], self.b
        n, c, h, w = x.shape
        c2 = c // (b * b)
        x_last, out_last = is_channels_last(x), is_channels_last(out)
        if x_last or out_last:
            return _copy(self._logical(out, out_last, target=True), self._logical(x, x_last))
        target = out.reshape(n, c2, h, b, w, b)
        if self.mode == "DCR":
            source = x.reshape(n, b, b, c2, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            source = x.reshape(n, c2, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        if not np.shares_memory(source, x):  # a non-contiguous input: reshape per run
            mode = self.mode

            def compute() -> None:
                if mode == "DCR":
                    src = x.reshape(n, b, b, c2, h, w).transpose(0, 3, 4, 1, 5, 2)
                else:
                    src = x.reshape(n, c2, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
                raw.copyto(target, src)

            return compute
        return _copy(target, source)

    def _logical(self, a: np.ndarray, last: bool, *, target: bool = False) -> np.ndarray:
        """The (N, C2, H, b1, W, b2) view of the input (or, target=True, the output)
        `a`, a view of its storage: NCHW, or channels-last when `last`."""
        b = self.b
        if target:
            n, c2, hb, wb = a.shape
            if last:
                six = a.transpose(0, 2, 3, 1).reshape(n, hb // b, b, wb // b, b, c2)
                return six.transpose(0, 5, 1, 2, 3, 4)
            return a.reshape(n, c2, hb // b, b, wb // b, b)
        n, c, h, w = a.shape
        c2 = c // (b * b)
        if not last:
            if self.mode == "DCR":
                return a.reshape(n, b, b, c2, h, w).transpose(0, 3, 4, 1, 5, 2)
            return a.reshape(n, c2, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        rows = a.transpose(0, 2, 3, 1)  # (N, H, W, C), contiguous
        if self.mode == "DCR":  # C = (b1, b2, c2)
            return rows.reshape(n, h, w, b, b, c2).transpose(0, 5, 1, 3, 2, 4)
        return rows.reshape(n, h, w, c2, b, b).transpose(0, 3, 1, 4, 2, 5)  # C = (c2, b1, b2)


class SpaceToDepth(Kernel):
    """NCHW: move blocksize x blocksize spatial tiles into channels (inverse of DCR)."""

    op = OpCode.SPACE_TO_DEPTH

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.input(0)
        b = attrs.int("blocksize", REQUIRED)
        if x.rank != 4 or b < 1 or x.shape[2] % b or x.shape[3] % b:
            raise self.fail(
                f"needs an NCHW input whose height and width divide by blocksize "
                f"{b}, got shape {list(x.shape)}"
            )
        n, c, h, w = x.shape
        self.b = b
        self.output_specs = [TensorSpec((n, c * b * b, h // b, w // b), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out, b = required(inputs, 0), outputs[0], self.b
        n, c, h, w = x.shape
        target = out.reshape(n, b, b, c, h // b, w // b)

        def source() -> np.ndarray:
            return x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)

        fixed = source()
        if not np.shares_memory(fixed, x):  # a non-contiguous input: reshape per run
            return lambda: raw.copyto(target, source())
        return _copy(target, fixed)
