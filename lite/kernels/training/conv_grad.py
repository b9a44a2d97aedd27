"""Gradients of Conv2D: CONV2D_BACKPROP_INPUT(g, w, x) and CONV2D_BACKPROP_FILTER(g, x, w).

Both take the forward node's attributes (strides, dilations, pads, auto_pad, group) and
resolve the same sliding window as the forward kernel (lite/kernels/spatial.py). The third
input only lends its shape (x for the input gradient, w for the filter gradient).

With K = in_channels/group * kh * kw and P = N * OH * OW, each group's filter gradient is
one GEMM, g (out/group, P) @ columns (P, K); the input gradient is the transposed GEMM
w^T (K, out/group) @ g (out/group, P) followed by a scatter-add of the columns back onto
the padded input (col2im), one whole-array add per kernel tap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.conv import im2col_view
from sporenet.lite.kernels.spatial import Window, check_nchw, window
from sporenet.lite.ops import OpCode


class _ConvGrad(Kernel):
    num_inputs = (3, 3)

    def _geometry(self, x: tuple[int, ...], w: tuple[int, ...], g: TensorSpec) -> None:
        """Check shapes like Conv2D does and resolve the window; sets self.win etc."""
        check_nchw(self, x, "x")
        if len(w) != 4:
            raise self.fail(f"weights must be 4-D (out_ch, in_ch/group, kh, kw), got {list(w)}")
        group = self.attrs.int("group", 1)
        if group < 1 or x[1] % group or w[0] % group or w[1] * group != x[1]:
            raise self.fail(f"group {group} does not fit x channels {x[1]} and weights "
                            f"{list(w)}")
        self.group = group
        self.win: Window = window(self, x[2:], (w[2], w[3]), self.attrs)
        expected = (x[0], w[0], *self.win.out)
        if g.shape != expected:
            raise self.fail(f"gradient shape {list(g.shape)} differs from the convolution's "
                            f"output shape {list(expected)}")
        n, c, h, wd = x
        top, left, bottom, right = self.win.pads
        eh, ew = self.win.extent
        self.padded_shape = (n, c, max(h + top + bottom, eh), max(wd + left + right, ew))
        self.interior = (slice(None), slice(None), slice(top, top + h), slice(left, left + wd))


class Conv2DBackpropFilter(_ConvGrad):
    """dW = sum over batch and positions of g (x) columns of the padded input."""

    op = OpCode.CONV2D_BACKPROP_FILTER

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x, w = self.require_float(0), self.require_float(1), self.input(2)
        self._geometry(x.shape, w.shape, g)
        self.output_specs = [TensorSpec(w.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, out = inputs[0], inputs[1], outputs[0]
        win, groups = self.win, self.group
        n, c = x.shape[:2]
        o, cig, kh, kw = out.shape
        oh, ow = win.out
        p = n * oh * ow
        if win.padded or self.padded_shape[2:] != x.shape[2:]:
            xp = np.zeros(self.padded_shape, x.dtype)
            interior = xp[self.interior]
            refresh = lambda: np.copyto(interior, x)  # noqa: E731
        else:
            xp, refresh = x, None
        cols = im2col_view(xp, win)  # (N, C, kh, kw, OH, OW)
        # Columns laid out (C, kh, kw, N, OH, OW) so each group is one (K, P) matrix.
        col_buf = np.empty((c, kh, kw, n, oh, ow), x.dtype)
        cols_t = cols.transpose(1, 2, 3, 0, 4, 5)
        g_buf = np.empty((o, n, oh, ow), g.dtype)
        g_t = g.transpose(1, 0, 2, 3)
        a = g_buf.reshape(groups, o // groups, p)
        b = col_buf.reshape(groups, cig * kh * kw, p).transpose(0, 2, 1)
        result = out.reshape(groups, o // groups, cig * kh * kw)

        def compute() -> None:
            if refresh is not None:
                refresh()
            np.copyto(col_buf, cols_t)
            np.copyto(g_buf, g_t)
            np.matmul(a, b, out=result)

        return compute


class Conv2DBackpropInput(_ConvGrad):
    """dx = col2im(w^T @ g), cropped to the unpadded input."""

    op = OpCode.CONV2D_BACKPROP_INPUT

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, w, x = self.require_float(0), self.require_float(1), self.input(2)
        self._geometry(x.shape, w.shape, g)
        self.output_specs = [TensorSpec(x.shape, g.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, w, out = inputs[0], inputs[1], outputs[0]
        win, groups = self.win, self.group
        o, cig, kh, kw = w.shape
        n, c = out.shape[:2]
        oh, ow = win.out
        p = n * oh * ow
        k = cig * kh * kw
        g_buf = np.empty((o, n, oh, ow), g.dtype)
        g_t = g.transpose(1, 0, 2, 3)
        wt = w.reshape(groups, o // groups, k).transpose(0, 2, 1)  # (G, K, O/G)
        cols = np.empty((groups, k, p), g.dtype)
        cols6 = cols.reshape(c, kh, kw, n, oh, ow)
        direct = not win.padded and self.padded_shape[2:] == out.shape[2:]
        dxp = out if direct else np.zeros(self.padded_shape, g.dtype)
        interior = dxp[self.interior]
        taps = [(i, j, win.tap(i, j)) for i in range(kh) for j in range(kw)]

        def compute() -> None:
            np.copyto(g_buf, g_t)
            np.matmul(wt, g_buf.reshape(groups, o // groups, p), out=cols)
            dxp.fill(0)
            for i, j, (rows, columns) in taps:
                target = dxp[:, :, rows, columns]
                np.add(target, cols6[:, i, j].transpose(1, 0, 2, 3), out=target)
            if not direct:
                np.copyto(out, interior)

        return compute
