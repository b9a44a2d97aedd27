"""MaxPool2D, AvgPool2D, GlobalAveragePool and GlobalMaxPool on NCHW (ONNX semantics).

Windowed pools are separable: a max (or sum) over the kh taps at every output row, then
over the kw taps of those rows, so a 3x3 pool is 4 whole-array NumPy calls instead of 8.
Rows go first because their taps read contiguous rows; the strided column taps then only
cover the output rows (columns first, they would cover every input row).
Borders come from a kernel-owned padded scratch (filled with -inf for max, 0 for average)
whose interior each call overwrites. Average divisors, which depend on padding, on
count_include_pad and on ceil_mode's overhanging windows, are computed once at prepare
as one reciprocal per output position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import ClassVar

import numpy as np

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
from sporenet.lite.kernels.spatial import Window, check_nchw, padded_buffer, window
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode


class _WindowPool(Kernel):
    """Shared prepare and bind of the two windowed pools."""

    fill: float
    """The padding value: one the reduction never picks over a real entry (set per
    instance where the dtype decides it, as the int8 max pool does)."""
    reduce: ClassVar[np.ufunc]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        check_nchw(self, x.shape)
        kernel = attrs.ints("kernel_shape", REQUIRED)
        if len(kernel) != 2:
            raise self.fail(f"kernel_shape must hold 2 values (kh, kw), got {kernel}")
        ceil_mode = attrs.int("ceil_mode", 0)
        if ceil_mode not in (0, 1):
            raise self.fail(f"ceil_mode must be 0 or 1, got {ceil_mode}")
        self.win = window(
            self, x.shape[2:], (kernel[0], kernel[1]), attrs, ceil_mode=bool(ceil_mode)
        )
        self.output_specs = [TensorSpec((*x.shape[:2], *self.win.out), x.dtype)]

    # Layout: every tap is a view of the input (or of a padded scratch laid out as the
    # input is), so the passes read and write either storage; a channels-last input keeps
    # a chain of NHWC layers (a BlazeBlock's strided branch) free of transposing copies.
    def channels_last_input(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED if index == 0 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return ChannelsLast.ACCEPTED if index == 0 else ChannelsLast.REFUSED

    def channels_last_follows(self, index: int) -> int | None:
        return 0 if index == 0 else None

    def _source(self, x: np.ndarray) -> tuple[np.ndarray, Compute | None]:
        """The (padded) array the taps read from, and the copy that refreshes it per call."""
        win = self.win
        needs_scratch = win.padded or any(
            e > s for e, s in zip(win.extent, x.shape[2:], strict=True)
        )
        if not needs_scratch:
            return x, None
        if is_channels_last(x):
            xp, interior = padded_buffer(x.transpose(0, 2, 3, 1), win, self.fill, axes=(1, 2))
            xp, interior = xp.transpose(0, 3, 1, 2), interior.transpose(0, 3, 1, 2)
        else:
            xp, interior = padded_buffer(x, win, self.fill)
        copyto = np.copyto
        return xp, lambda: copyto(interior, x)

    def _bind_reduce(self, x: np.ndarray, out: np.ndarray) -> Compute:
        """out = reduce over the window taps, done rows-then-columns."""
        win = self.win
        (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
        src, refresh = self._source(x)
        n, cols = src.shape[0], src.shape[3]
        # A batch runs in blocks of images (about _BLOCK_BYTES of input), so the column
        # pass reads a block's row results while they are still in cache.
        step = max(1, min(n, _BLOCK_BYTES // max(1, src[0].nbytes))) if kh > 1 else n
        # The row pass rewrites all of `tmp` each call: it comes from the plan's arena,
        # laid out as the input is (ufuncs over one layout walk memory in order).
        tmp = None
        if kh > 1:
            shape = (step, x.shape[1], oh, cols)
            if is_channels_last(src):
                tmp = temporary((step, oh, cols, x.shape[1]), x.dtype).transpose(0, 3, 1, 2)
            else:
                tmp = temporary(shape, x.dtype)
        f = self.reduce
        steps: list[Callable[[], object]] = []
        if refresh is not None:
            steps.append(refresh)
        for start in range(0, n, step):
            block, m = src[start : start + step], min(step, n - start)
            # Row pass first: the kh taps at each output row, over whole padded rows (each
            # tap a view of contiguous rows, so the reads run at memory speed).
            rows = [block[:, :, slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)] for i in range(kh)]
            part = rows[0] if tmp is None else tmp[:m]
            # Column pass: the kw taps over the row results at each output column. Its
            # strided reads now cover only the oh output rows, not every padded input row.
            col_taps = [part[..., j * dw : j * dw + sw * (ow - 1) + 1 : sw] for j in range(kw)]
            if tmp is not None:
                steps.append(_fold(f, rows, part))
            steps.append(_fold(f, col_taps, out[start : start + m]))
        if len(steps) > 3:

            def blocks() -> None:
                for run in steps:
                    run()

            return blocks
        if len(steps) == 1:
            return steps[0]  # type: ignore[return-value]
        if len(steps) == 2:
            a, b = steps

            def two() -> None:
                a()
                b()

            return two
        a, b, c = steps

        def three() -> None:
            a()
            b()
            c()

        return three


_BLOCK_BYTES = 384 << 10
"""Bytes of (padded) input per block of images in a windowed pool over a batch."""


def _fold(f: np.ufunc, views: list[np.ndarray], out: np.ndarray) -> Callable[[], object]:
    """out = f(f(v0, v1), v2)... with out as the accumulator (one call per extra view)."""
    if len(views) == 1:
        copyto, v = np.copyto, views[0]
        return lambda: copyto(out, v)
    first, second, rest = views[0], views[1], views[2:]
    if not rest:
        return lambda: f(first, second, out=out)

    def fold() -> None:
        f(first, second, out=out)
        for v in rest:
            f(out, v, out=out)

    return fold


def first_maxima(
    windows: Iterable[np.ndarray],
    y: np.ndarray,
    hit: np.ndarray | Sequence[np.ndarray],
    free: np.ndarray,
    *,
    positive_only: bool = False,
) -> Iterator[None]:
    """Walk the taps' views of x in row-major order, leaving in `hit` at each step the
    windows whose first element equal to the maximum y is at that tap (`free`: scratch of
    the windows still unrouted; with positive_only, only windows whose y > 0 are routed).
    `hit` is one array rewritten at each step, or one array per tap (a routing mask).
    The one tie rule of MAX_POOL2D's routing mask, MAX_POOL2D_GRAD and its adjoint."""
    if positive_only:
        np.greater(y, 0, out=free)
    single = hit if isinstance(hit, np.ndarray) else None
    for t, xt in enumerate(windows):
        h = hit[t] if single is None else single
        np.equal(xt, y, out=h)
        if t == 0 and not positive_only:  # every window is still free: no mask to apply
            np.logical_not(h, out=free)
        else:
            np.logical_and(h, free, out=h)
            np.logical_xor(free, h, out=free)
        yield


class MaxPool2D(_WindowPool):
    """Max over each window; padding never wins.

    With two outputs, output 1 holds ONNX's Indices: where each max sits in the flattened
    (N, C, H, W) input, row-major within a plane (storage_order=0) or column-major
    (storage_order=1); the first window position in row-major order on ties.
    With routing=1 (training graphs), output 1 is instead the routing mask MAX_POOL2D_GRAD
    reads: bool (kh * kw, N, C, OH, OW), mask[t] true where tap t (row-major) holds the
    window's first maximum; with positive_only=1 as well, only in windows whose maximum
    is positive (the derivative of a ReLU after the pool, which the gradient then needs
    no pass of its own for). Windows that tile x are then split once into tap-major
    planes, from which both y and the mask come in whole-plane passes; the gradient then
    skips the comparisons it would otherwise repeat over strided views of x.
    """

    op = OpCode.MAX_POOL2D
    fill = -np.inf
    reduce = np.maximum

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        if attrs.num_outputs > 2:
            raise self.fail(f"has at most 2 outputs (Y, Indices), got {attrs.num_outputs}")
        self.storage_order = attrs.int("storage_order", 0)
        if self.storage_order not in (0, 1):
            raise self.fail(f"storage_order must be 0 or 1, got {self.storage_order}")
        self.routing = attrs.int("routing", 0)
        if self.routing not in (0, 1):
            raise self.fail(f"routing must be 0 or 1, got {self.routing}")
        positive_only = attrs.int("positive_only", 0)
        if positive_only not in (0, 1):
            raise self.fail(f"positive_only must be 0 or 1, got {positive_only}")
        self.positive_only = bool(positive_only)
        if self.positive_only and not self.routing:
            raise self.fail("positive_only=1 needs routing=1 (it shapes the routing mask)")
        if self.routing and attrs.num_outputs != 2:
            raise self.fail(f"routing=1 needs 2 outputs (Y, mask), got {attrs.num_outputs}")
        y_shape = self.output_specs[0].shape
        if self.routing:
            taps = self.win.kernel[0] * self.win.kernel[1]
            self.output_specs.append(TensorSpec((taps, *y_shape), np.dtype(np.bool_)))
        elif attrs.num_outputs == 2:
            self.output_specs.append(TensorSpec(y_shape, np.dtype(np.int64)))

    # The indices scan compares NCHW scratch arrays with the taps: NCHW only then.
    def channels_last_input(self, index: int) -> ChannelsLast:
        one = len(self.output_specs) == 1
        return super().channels_last_input(index) if one else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        one = len(self.output_specs) == 1
        return super().channels_last_output(index) if one else ChannelsLast.REFUSED

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x = required(inputs, 0)
        if self.routing:
            if self._tiles(x) and outputs[1].flags.c_contiguous:
                return self._bind_split_routing(x, outputs[0], outputs[1])
            return self._bind_routing(x, outputs[0], outputs[1])
        pool = self._bind_reduce(x, outputs[0])
        if len(outputs) < 2:
            return pool
        return self._bind_indices(x, outputs[1], pool)

    def _tiles(self, x: np.ndarray) -> bool:
        """Whether the windows tile a C-contiguous x exactly (kernel == strides, no
        padding or dilation): then x reshapes, as a view, to (N, C, OH, kh, OW, kw)."""
        win = self.win
        return (
            x.flags.c_contiguous
            and win.kernel == win.strides
            and win.dilations == (1, 1)
            and not win.padded
            and x.shape[2:] == tuple(o * k for o, k in zip(win.out, win.kernel, strict=True))
        )

    def _bind_routing(self, x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> Compute:
        """y by the separable pool, then the routing mask by the first-maximum walk over
        the taps' (strided) views of the padded input."""
        win = self.win
        pool = self._bind_reduce(x, y)
        src, refresh = self._source(x)
        windows = [src[(slice(None), slice(None), *win.tap(i, j))] for i, j in _taps(win)]
        hits = list(mask)
        free = np.empty(y.shape, np.bool_)
        positive = self.positive_only

        def compute() -> None:
            pool()
            if refresh is not None:
                refresh()
            for _ in first_maxima(windows, y, hits, free, positive_only=positive):
                pass

        return compute

    def _bind_split_routing(self, x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> Compute:
        """Tiling windows: per block of images, one copy splits x into tap-major planes
        (kh * kw, images, C, OH, OW), each as contiguous as y; y is then the maximum over
        the planes and the mask the first-maximum walk over them, all whole-array passes
        (a strided view of x is several times slower per element)."""
        (kh, kw), (oh, ow) = self.win.kernel, self.win.out
        n, c = x.shape[:2]
        taps = kh * kw
        step = max(1, min(n, _BLOCK_BYTES // max(1, x[0].nbytes)))
        split = temporary((taps, step, c, oh, ow), x.dtype)
        by_tap = split.reshape(kh, kw, step, c, oh, ow)  # a view: split is contiguous
        free = np.empty((step, c, oh, ow), np.bool_)
        blocks = []
        for b in range(0, n, step):
            m = min(step, n - b)
            source = x[b : b + m].reshape(m, c, oh, kh, ow, kw).transpose(3, 5, 0, 1, 2, 4)
            planes, target = split[:, :m], by_tap[:, :, :m]
            hits = list(mask[:, b : b + m])
            blocks.append((target, source, list(planes), y[b : b + m], hits, free[:m]))
        copyto, maximum, positive = np.copyto, np.maximum, self.positive_only

        def compute() -> None:
            for target, source, planes, yb, hits, fb in blocks:
                copyto(target, source)
                if taps == 1:
                    copyto(yb, planes[0])
                else:
                    maximum(planes[0], planes[1], out=yb)
                for plane in planes[2:]:
                    maximum(yb, plane, out=yb)
                for _ in first_maxima(planes, yb, hits, fb, positive_only=positive):
                    pass

        return compute

    def _bind_indices(self, x: np.ndarray, indices: np.ndarray, pool: Compute) -> Compute:
        """Indices by a scan over the window taps keeping the first strict maximum."""
        win = self.win
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
        top, left = win.pads[0], win.pads[1]
        src, refresh = self._source(x)
        rows, cols = np.arange(oh)[:, None] * sh - top, np.arange(ow)[None, :] * sw - left
        taps = []
        for i in range(kh):
            for j in range(kw):
                r, q = rows + i * dh, cols + j * dw
                where = r * w + q if self.storage_order == 0 else q * h + r
                taps.append((src[(slice(None), slice(None), *win.tap(i, j))], where))
        planes = (np.arange(n * c, dtype=np.int64) * h * w).reshape(n, c, 1, 1)
        best = np.empty(indices.shape, x.dtype)
        better = np.empty(indices.shape, np.bool_)
        copyto, greater, add = np.copyto, np.greater, np.add

        def compute() -> None:
            pool()
            if refresh is not None:
                refresh()
            best.fill(-np.inf)
            indices.fill(0)
            for view, where in taps:
                greater(view, best, out=better)
                copyto(best, view, where=better)
                copyto(indices, where, where=better)
            add(indices, planes, out=indices)

        return compute


class AvgPool2D(_WindowPool):
    """Mean over each window; count_include_pad chooses whether padding counts.

    Windows that ceil_mode lets hang past the bottom/right padding divide by the part that
    lies inside the padded input (count_include_pad=1) or inside the input (=0), as
    onnxruntime and PyTorch do.
    """

    op = OpCode.AVG_POOL2D
    fill = 0.0
    reduce = np.add

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        include = attrs.int("count_include_pad", 0)
        if include not in (0, 1):
            raise self.fail(f"count_include_pad must be 0 or 1, got {include}")
        x = self.input(0)
        counts = [
            _window_counts(self.win, axis, x.shape[2 + axis], bool(include)) for axis in range(2)
        ]
        divisor = np.outer(counts[0], counts[1])
        if (divisor == 0).any():
            raise self.fail("a pooling window covers no input element (pads too large?)")
        # A single scalar when every window has the same size (the common case).
        scale = (1.0 / divisor).astype(x.dtype)
        self.scale = scale.flat[0] if (scale == scale.flat[0]).all() else scale

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        out = outputs[0]
        x = required(inputs, 0)
        win = self.win
        whole = win.kernel == x.shape[2:] and win.dilations == (1, 1)
        if whole and win.out == (1, 1) and not any(win.pads):
            # One window over the whole plane (a Keras GlobalAveragePooling2D as TFLite
            # stores it): the global mean's product, not kh + kw passes of tap sums.
            return plane_mean(x, out)
        pool = self._bind_reduce(x, out)
        scale, multiply = self.scale, np.multiply

        def compute() -> None:
            pool()
            multiply(out, scale, out=out)

        return compute


def _taps(win: Window) -> list[tuple[int, int]]:
    """The window's (row, column) taps in row-major order, the order ties go by."""
    return [(i, j) for i in range(win.kernel[0]) for j in range(win.kernel[1])]


def _window_counts(win: Window, axis: int, size: int, include_pad: bool) -> np.ndarray:
    """How many elements of each output position's window count for the average."""
    k, s, d, o = win.kernel[axis], win.strides[axis], win.dilations[axis], win.out[axis]
    begin, end = win.pads[axis], win.pads[axis + 2]
    pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d  # padded coordinates
    lo, hi = (0, size + begin + end) if include_pad else (begin, begin + size)
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


class _GlobalPool(Kernel):
    """Reduce every spatial axis (2..rank-1) to size 1."""

    reduce: ClassVar[Callable[..., np.ndarray]]

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x = self.require_float(0)
        if x.rank < 3:
            raise self.fail(f"input must be (N, C, spatial...), got shape {list(x.shape)}")
        if x.size == 0:
            raise self.fail(f"input must not be empty, got shape {list(x.shape)}")
        self.output_specs = [TensorSpec((*x.shape[:2], *[1] * (x.rank - 2)), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, out = inputs[0], outputs[0]
        n, c = x.shape[:2]
        x3, out2, f = x.reshape(n, c, -1), out.reshape(n, c), type(self).reduce
        return lambda: f(x3, axis=2, out=out2)


class GlobalAvgPool(_GlobalPool):
    """Mean over the spatial axes, as one matrix-vector product with a constant 1/(H*W)
    vector: a reduction over short rows (3x3 planes of 1280 channels) is slow in NumPy."""

    op = OpCode.GLOBAL_AVG_POOL
    reduce = np.mean

    def channels_last_input(self, index: int) -> ChannelsLast:
        # Stored channels-last, the input is the (H*W, C) matrix and the mean a
        # vector-matrix product over its rows: as fast, and the producer skips a transpose.
        return ChannelsLast.ACCEPTED if self.input(0).rank == 4 else ChannelsLast.REFUSED

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        return plane_mean(required(inputs, 0), outputs[0])


def plane_mean(x: np.ndarray, out: np.ndarray) -> Compute:
    """The step writing out (N, C, 1, ...) = the mean of x (N, C, spatial...) over its
    spatial axes, as one product with a constant 1/(H*W) vector; a channels-last x is
    the (H*W, C) matrix, whose mean is a vector-matrix product over its rows."""
    n, c = x.shape[:2]
    out2, matmul = out.reshape(n, c), np.matmul
    if x.ndim == 4 and not x.flags.c_contiguous and x.transpose(0, 2, 3, 1).flags.c_contiguous:
        rows = x.transpose(0, 2, 3, 1).reshape(n, -1, c)  # (N, H*W, C), a view
        weights = np.full(rows.shape[1], 1.0 / rows.shape[1], x.dtype)
        return lambda: matmul(weights, rows, out=out2)
    x3 = x.reshape(n, c, -1)
    weights = np.full(x3.shape[2], 1.0 / x3.shape[2], x.dtype)
    return lambda: matmul(x3, weights, out=out2)


class GlobalMaxPool(_GlobalPool):
    op = OpCode.GLOBAL_MAX_POOL
    reduce = np.max
