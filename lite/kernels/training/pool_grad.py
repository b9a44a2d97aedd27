"""Gradients of MaxPool2D and AvgPool2D (forward: lite/kernels/pooling.py).

MAX_POOL2D_GRAD(g, x, y) routes each output gradient to the first window element equal to
the window's maximum y (ties go to the first tap in row-major order). AVG_POOL2D_GRAD(g, x)
spreads each output gradient evenly over its window with the forward's divisors. Both take
the forward node's attributes and work on a zero-initialized padded gradient buffer.
MAX_POOL2D_GRAD(g, x, y, mask) takes the routing mask the forward made (MAX_POOL2D with
routing=1, output 1) instead of finding the maxima again: each tap's share is g times
its plane of the mask, one pass per tap.
MAX_POOL2D_SELECT(u, x, y), MAX_POOL2D_GRAD's adjoint, reads u at the taps it routes to.
With relu=1 both also take the derivative of a ReLU applied to y (a pool the training
graph moved before its ReLU): windows whose maximum is not positive route nothing, which
costs no pass of its own (the routing starts from y > 0 instead of from every window;
with a mask, g is masked by y > 0 first, a pass over the small pooled tensor).
"""

from __future__ import annotations

from collections.abc import Sequence

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
from sporenet.lite.kernels.pooling import first_maxima
from sporenet.lite.kernels.spatial import Window, check_nchw, window
from sporenet.lite.ops import OpCode

__all__ = ["AvgPool2DGrad", "MaxPool2DGrad", "MaxPool2DSelect", "first_maxima"]

_TILED_BLOCK_BYTES = 384 << 10
"""Bytes of x per block of images in the tiled max-pool gradient: each tap's strided pass
over a whole batch's x would stream it from memory again."""


class _PoolGrad(Kernel):
    def _geometry(self, g: TensorSpec, x: TensorSpec) -> None:
        check_nchw(self, x.shape, "x")
        kernel = self.attrs.ints("kernel_shape", REQUIRED)
        if len(kernel) != 2:
            raise self.fail(f"kernel_shape must hold 2 values (kh, kw), got {kernel}")
        ceil_mode = bool(self.attrs.int("ceil_mode", 0))
        self.win: Window = window(
            self, x.shape[2:], (kernel[0], kernel[1]), self.attrs, ceil_mode=ceil_mode
        )
        expected = (*x.shape[:2], *self.win.out)
        if g.shape != expected:
            raise self.fail(
                f"gradient shape {list(g.shape)} differs from the pool's output "
                f"shape {list(expected)}"
            )
        n, c, h, w = x.shape
        top, left, bottom, right = self.win.pads
        eh, ew = self.win.extent
        self.padded_shape = (n, c, max(h + top + bottom, eh), max(w + left + right, ew))
        self.interior = (slice(None), slice(None), slice(top, top + h), slice(left, left + w))
        self.taps = [self.win.tap(i, j) for i in range(kernel[0]) for j in range(kernel[1])]
        self.output_specs = [TensorSpec(x.shape, g.dtype)]

    def _relu(self) -> bool:
        """The `relu` attribute: 1 folds in the derivative of a ReLU applied to y."""
        relu = self.attrs.int("relu", 0)
        if relu not in (0, 1):
            raise self.fail(f"relu must be 0 or 1, got {relu}")
        return bool(relu)


class MaxPool2DGrad(_PoolGrad):
    op = OpCode.MAX_POOL2D_GRAD
    num_inputs = (3, 4)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x, y = self.require_float(0), self.require_float(1), self.input(2)
        self._geometry(g, x)
        if y.shape != g.shape:
            raise self.fail(f"y shape {list(y.shape)} differs from the gradient's {list(g.shape)}")
        self.relu = self._relu()
        mask = self.optional_input(3)
        if mask is not None:
            expected = (len(self.taps), *g.shape)
            if mask.shape != expected or mask.dtype != np.bool_:
                raise self.fail(
                    f"routing mask must be bool {list(expected)} (MAX_POOL2D routing=1, "
                    f"output 1), got {mask.dtype} {list(mask.shape)}"
                )

    def _tiled(self, x: np.ndarray | TensorSpec) -> bool:
        """Whether the windows tile x exactly (kernel == stride, no padding or dilation)."""
        win = self.win
        return (
            win.kernel == win.strides
            and win.dilations == (1, 1)
            and not win.padded
            and x.shape[2:] == tuple(o * k for o, k in zip(win.out, win.kernel, strict=True))
        )

    def channels_last_output(self, index: int) -> ChannelsLast:
        # With a routing mask over tiling windows each tap writes its strided view of dx,
        # which any layout of dx allows (about as fast channels-last); readers that copy
        # dx into channels-last buffers (the convolution gradients) then copy runs.
        routed = self.optional_input(3) is not None and self._tiled(self.input(1))
        return ChannelsLast.ACCEPTED if routed else ChannelsLast.REFUSED

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, y = (required(inputs, k) for k in range(3))
        out = outputs[0]
        mask = inputs[3] if len(inputs) > 3 else None
        if mask is not None and self._tiled(x):
            return self._bind_routed_tiled(g, y, mask, out)
        if mask is not None:
            return self._bind_routed(g, y, mask, out)
        if self._tiled(x):
            return self._bind_tiled(g, x, y, out)
        xp = np.full(self.padded_shape, -np.inf, x.dtype)
        x_in = xp[self.interior]
        dxp = np.zeros(self.padded_shape, g.dtype)
        dx_in = dxp[self.interior]
        free = np.empty(g.shape, np.bool_)  # outputs whose gradient is not yet routed
        hit = np.empty(g.shape, np.bool_)
        contribution = np.empty(g.shape, g.dtype)
        taps, relu = self.taps, self.relu

        def compute() -> None:
            np.copyto(x_in, x)
            dxp.fill(0)
            windows = (xp[:, :, rows, cols] for rows, cols in taps)
            routed = first_maxima(windows, y, hit, free, positive_only=relu)
            for (rows, cols), _ in zip(taps, routed, strict=True):
                np.multiply(g, hit, out=contribution)
                target = dxp[:, :, rows, cols]
                np.add(target, contribution, out=target)
            np.copyto(out, dx_in)

        return compute

    def _bind_routed_tiled(
        self, g: np.ndarray, y: np.ndarray, mask: np.ndarray, out: np.ndarray
    ) -> Compute:
        """Windows that tile x, with the forward's routing mask: each tap's share of out is
        g times the tap's plane of the mask, written directly, for blocks of images (as
        _bind_tiled). With relu=1, g is first masked by y > 0."""
        (kh, kw) = self.win.kernel
        n = g.shape[0]
        step = max(1, min(n, _TILED_BLOCK_BYTES // max(1, out[0].nbytes)))
        positive = np.empty((step, *g.shape[1:]), np.bool_)
        masked = np.empty((step, *g.shape[1:]), g.dtype)
        blocks = []
        for b in range(0, n, step):
            m, ob = min(step, n - b), out[b : b + step]
            targets = [ob[:, :, i::kh, j::kw] for i in range(kh) for j in range(kw)]
            planes = list(mask[:, b : b + m])
            blocks.append((g[b : b + m], y[b : b + m], positive[:m], masked[:m], planes, targets))
        multiply, greater, relu = np.multiply, np.greater, self.relu

        def compute() -> None:
            for gb, yb, pb, mb, planes, targets in blocks:
                source = gb
                if relu:
                    greater(yb, 0, out=pb)
                    multiply(gb, pb, out=mb)
                    source = mb
                for plane, target in zip(planes, targets, strict=True):
                    multiply(source, plane, out=target)

        return compute

    def _bind_routed(
        self, g: np.ndarray, y: np.ndarray, mask: np.ndarray, out: np.ndarray
    ) -> Compute:
        """Any window, with the forward's routing mask: g times each tap's plane of the
        mask is added onto a zeroed padded buffer, whose interior is dx."""
        dxp = np.zeros(self.padded_shape, g.dtype)
        interior = dxp[self.interior]
        targets = [dxp[:, :, rows, cols] for rows, cols in self.taps]
        planes = list(mask)
        positive = np.empty(g.shape, np.bool_)
        masked = np.empty(g.shape, g.dtype)
        contribution = np.empty(g.shape, g.dtype)
        multiply, add, relu = np.multiply, np.add, self.relu

        def compute() -> None:
            source = g
            if relu:
                np.greater(y, 0, out=positive)
                multiply(g, positive, out=masked)
                source = masked
            dxp.fill(0)
            for plane, target in zip(planes, targets, strict=True):
                multiply(source, plane, out=contribution)
                add(target, contribution, out=target)
            np.copyto(out, interior)

        return compute

    def _bind_tiled(self, g: np.ndarray, x: np.ndarray, y: np.ndarray, out: np.ndarray) -> Compute:
        """Windows that tile x exactly (kernel == stride, no padding): every element of x
        belongs to one window, so each tap writes its share of out directly (no buffer,
        no accumulation); ties still go to the first maximum. The taps' strided passes
        run over blocks of images (about _TILED_BLOCK_BYTES of x), so all but the first
        find the block's x and out in cache."""
        (kh, kw) = self.win.kernel
        n = x.shape[0]
        step = max(1, min(n, _TILED_BLOCK_BYTES // max(1, x[0].nbytes)))
        free = np.empty((step, *g.shape[1:]), np.bool_)
        hit = np.empty((step, *g.shape[1:]), np.bool_)
        blocks = []
        for b in range(0, n, step):
            xb, ob, m = x[b : b + step], out[b : b + step], min(step, n - b)
            windows = [xb[:, :, i::kh, j::kw] for i in range(kh) for j in range(kw)]
            targets = [ob[:, :, i::kh, j::kw] for i in range(kh) for j in range(kw)]
            blocks.append((windows, targets, y[b : b + m], g[b : b + m], hit[:m], free[:m]))
        multiply, relu = np.multiply, self.relu

        def compute() -> None:
            for windows, targets, yb, gb, hb, fb in blocks:
                routed = first_maxima(windows, yb, hb, fb, positive_only=relu)
                for dt, _ in zip(targets, routed, strict=True):
                    multiply(gb, hb, out=dt)

        return compute


class MaxPool2DSelect(_PoolGrad):
    """MAX_POOL2D_SELECT(u, x, y): u at the tap each window's gradient is routed to by
    MAX_POOL2D_GRAD (the first element equal to the maximum), its adjoint in g."""

    op = OpCode.MAX_POOL2D_SELECT
    num_inputs = (3, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        u, x, y = self.require_float(0), self.require_float(1), self.input(2)
        if u.shape != x.shape:
            raise self.fail(f"u shape {list(u.shape)} differs from x's {list(x.shape)}")
        self._geometry(y, x)
        self.output_specs = [TensorSpec(y.shape, u.dtype)]
        self.relu = self._relu()

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        u, x, y = (required(inputs, k) for k in range(3))
        out = outputs[0]
        xp = np.full(self.padded_shape, -np.inf, x.dtype)
        up = np.zeros(self.padded_shape, u.dtype)
        x_in, u_in = xp[self.interior], up[self.interior]
        free = np.empty(y.shape, np.bool_)  # windows whose maximum is not yet found
        hit = np.empty(y.shape, np.bool_)
        picked = np.empty(y.shape, u.dtype)
        taps, relu = self.taps, self.relu

        def compute() -> None:
            np.copyto(x_in, x)
            np.copyto(u_in, u)
            out.fill(0)
            windows = (xp[:, :, rows, cols] for rows, cols in taps)
            routed = first_maxima(windows, y, hit, free, positive_only=relu)
            for (rows, cols), _ in zip(taps, routed, strict=True):
                np.multiply(up[:, :, rows, cols], hit, out=picked)
                np.add(out, picked, out=out)

        return compute


class AvgPool2DGrad(_PoolGrad):
    op = OpCode.AVG_POOL2D_GRAD
    num_inputs = (2, 2)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x = self.require_float(0), self.require_float(1)
        self._geometry(g, x)
        include = bool(attrs.int("count_include_pad", 0))
        counts = [_window_counts(self.win, axis, x.shape[2 + axis], include) for axis in (0, 1)]
        divisor = np.outer(counts[0], counts[1])
        if (divisor == 0).any():
            raise self.fail("a pooling window covers no input element (pads too large?)")
        self.scale = (1.0 / divisor).astype(g.dtype)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, out = inputs[0], outputs[0]
        dxp = np.zeros(self.padded_shape, g.dtype)
        dx_in = dxp[self.interior]
        scaled = np.empty(g.shape, g.dtype)
        scale, taps = self.scale, self.taps

        def compute() -> None:
            np.multiply(g, scale, out=scaled)
            dxp.fill(0)
            for rows, cols in taps:
                target = dxp[:, :, rows, cols]
                np.add(target, scaled, out=target)
            np.copyto(out, dx_in)

        return compute


def _window_counts(win: Window, axis: int, size: int, include_pad: bool) -> np.ndarray:
    """Elements of each output position's window that count for the average (as the
    forward AvgPool2D computes them)."""
    k, s, d, o = win.kernel[axis], win.strides[axis], win.dilations[axis], win.out[axis]
    begin, end = win.pads[axis], win.pads[axis + 2]
    pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d  # padded coordinates
    lo, hi = (0, size + begin + end) if include_pad else (begin, begin + size)
    return ((pos >= lo) & (pos < hi)).sum(axis=1)
