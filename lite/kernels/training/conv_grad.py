"""Gradients of Conv2D: CONV2D_BACKPROP_INPUT(g, w, x) and CONV2D_BACKPROP_FILTER(g, x, w).

Both take the forward node's attributes (strides, dilations, pads, auto_pad, group) and
resolve the same sliding window as the forward kernel (lite/kernels/spatial.py). The third
input only lends its shape (x for the input gradient, w for the filter gradient); the input
gradient may take that shape as an `input_shape` attribute instead ([N, C, H, W], N -1 for
g's batch), as ONNX ConvTranspose imports do, so no shape-only tensor is made.

Both work channels-last: with K = kh * kw * in_channels/group and P = N * OH * OW, each
group's filter gradient is one GEMM, g (out/group, P) @ columns (P, K), where the columns
are copied from a channels-last padded input (contiguous channel runs); the input
gradient is the GEMM g (P, out/group) @ w (out/group, K) followed by a scatter-add of the
columns onto a channels-last padded buffer (col2im), one whole-array add per kernel tap,
and one transposing copy back to NCHW.
A stride-1 filter gradient over a batch builds its columns from NCHW in whole padded
rows instead (Conv2DBackpropFilter._bind_wide_rows).

CONV2D_BACKPROP_FILTER may have a second output, the bias gradient (g summed over the
batch and positions, one value per output channel): a training graph asks for it so the
sum rides in the filter gradient's GEMM as a row of ones under the columns, where a
separate REDUCE_SUM would stream g from memory once more.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels.base import (
    Attrs,
    ChannelsLast,
    Compute,
    Kernel,
    TensorSpec,
    required,
)
from sporenet.lite.kernels.conv_common import UNPACKED_GEMM, matmul_for
from sporenet.lite.kernels.im2col_wide import WideRows, wide_rows_pay
from sporenet.lite.kernels.spatial import Window, check_nchw, window
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode

NARROW_CHANNELS = 8
"""Below this many input channels per group, the filter gradient's columns are built
channels-first (whole-plane copies) rather than channels-last (runs of C/G floats): on
64x28x28 inputs, 1 channel 0.49 ms against 1.88, 6 channels 2.47 against 3.91; even at 8."""
_PER_IMAGE_BYTES = 8 << 20
"""Largest batch of per-image filter gradients (N copies of the filter) summed at the end;
beyond it the filter gradient is one GEMM over the whole batch."""
_WIDE_BLOCK_BYTES = 512 << 10
"""Bytes of wide-row columns per block of images (copied, then multiplied from cache)."""


def images_per_block(n: int, macs_per_image: int) -> int:
    """How many of a batch's n images one column block + GEMM covers: as many as keep the
    product within OpenBLAS's unpacked limit (UNPACKED_GEMM multiply-adds), at least one.
    Building the whole batch's columns and multiplying them in one call streams them
    through memory twice; a block's columns are still in cache when the GEMM reads them."""
    return max(1, min(n, UNPACKED_GEMM // max(1, macs_per_image)))


class _ConvGrad(Kernel):
    num_inputs = (3, 3)

    def _geometry(self, x: tuple[int, ...], w: tuple[int, ...], g: TensorSpec) -> None:
        """Check shapes like Conv2D does and resolve the window; sets self.win etc."""
        check_nchw(self, x, "x")
        if len(w) != 4:
            raise self.fail(f"weights must be 4-D (out_ch, in_ch/group, kh, kw), got {list(w)}")
        group = self.attrs.int("group", 1)
        if group < 1 or x[1] % group or w[0] % group or w[1] * group != x[1]:
            raise self.fail(f"group {group} does not fit x channels {x[1]} and weights {list(w)}")
        self.group = group
        self.win: Window = window(self, x[2:], (w[2], w[3]), self.attrs)
        expected = (x[0], w[0], *self.win.out)
        if g.shape != expected:
            raise self.fail(
                f"gradient shape {list(g.shape)} differs from the convolution's "
                f"output shape {list(expected)}"
            )
        n, c, h, wd = x
        top, left, bottom, right = self.win.pads
        eh, ew = self.win.extent
        self.padded_shape = (n, c, max(h + top + bottom, eh), max(wd + left + right, ew))
        self.interior = (slice(None), slice(None), slice(top, top + h), slice(left, left + wd))


def _nhwc_columns(xp: np.ndarray, win: Window) -> np.ndarray:
    """Read-only (N, OH, OW, kh, kw, C) view of a channels-last padded input."""
    sn, sh, sw, sc = xp.strides
    (kh, kw), (oh, ow) = win.kernel, win.out
    (th, tw), (dh, dw) = win.strides, win.dilations
    return np.lib.stride_tricks.as_strided(
        xp,
        shape=(xp.shape[0], oh, ow, kh, kw, xp.shape[3]),
        strides=(sn, sh * th, sw * tw, sh * dh, sw * dw, sc),
        writeable=False,
    )


class Conv2DBackpropFilter(_ConvGrad):
    """dW = sum over batch and positions of g (x) columns of the padded input."""

    op = OpCode.CONV2D_BACKPROP_FILTER

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, x, w = self.require_float(0), self.require_float(1), self.input(2)
        self._geometry(x.shape, w.shape, g)
        if attrs.num_outputs not in (1, 2):
            raise self.fail(
                f"has 1 or 2 outputs (filter gradient, bias gradient), got {attrs.num_outputs}"
            )
        self.output_specs = [TensorSpec(w.shape, g.dtype)]
        if attrs.num_outputs == 2:
            self.output_specs.append(TensorSpec((w.shape[0],), g.dtype))
        narrow = w.shape[1] < NARROW_CHANNELS or (w.shape[1] == 1 and self.group > 1)
        self.wide = (
            not narrow and self.group == 1 and x.shape[0] > 1 and wide_rows_pay(self.win, x.shape)
        )

    def channels_last_input(self, index: int) -> ChannelsLast:
        # The wide-row path reads g only through its copy into channels-last rows, which
        # g stored channels-last makes a copy of contiguous runs instead of a transpose.
        return ChannelsLast.PREFERRED if index == 0 and self.wide else ChannelsLast.REFUSED

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, x, out = required(inputs, 0), required(inputs, 1), outputs[0]
        db = outputs[1] if len(outputs) > 1 else None
        if out.shape[1] == 1 and self.group > 1:  # depthwise (a lone channel: GEMM wins)
            return _with_bias_sum(self._bind_depthwise(g, x, out), g, db)
        if out.shape[1] < NARROW_CHANNELS:
            return self._bind_planes(g, x, out, db)
        if self.wide:
            return self._bind_wide_rows(g, x, out, db)
        return _with_bias_sum(self._bind_columns(g, x, out), g, db)

    def _bind_columns(self, g: np.ndarray, x: np.ndarray, out: np.ndarray) -> Compute:
        """Channels-last columns: per-image products for small layers (_bind_image_blocks),
        else one GEMM per group over the whole batch."""
        per_image = out.size * self.win.out[0] * self.win.out[1] // self.group
        if out.nbytes * x.shape[0] <= _PER_IMAGE_BYTES and per_image <= UNPACKED_GEMM:
            return self._bind_image_blocks(g, x, out, images_per_block(x.shape[0], per_image))
        win, groups = self.win, self.group
        n, c, h, wd = x.shape
        o, cig, kh, kw = out.shape
        cog = o // groups
        oh, ow = win.out
        p = n * oh * ow
        top, left = win.pads[:2]
        hp, wp = self.padded_shape[2:]
        # Channels-last padded input; its zero border is written once.
        xp = np.zeros((n, hp, wp, c), x.dtype)
        x_in, x_t = xp[:, top : top + h, left : left + wd, :], x.transpose(0, 2, 3, 1)
        columns = _nhwc_columns(xp, win).reshape(n, oh, ow, kh, kw, groups, cig)
        cols = np.empty((groups, n, oh, ow, kh, kw, cig), x.dtype)
        cols_src = columns.transpose(5, 0, 1, 2, 3, 4, 6)
        g_buf = np.empty((o, n, oh, ow), g.dtype)
        g_t = g.transpose(1, 0, 2, 3)
        result = np.empty((groups, cog, kh * kw * cig), g.dtype)
        a = g_buf.reshape(groups, cog, p)
        b = cols.reshape(groups, p, kh * kw * cig)
        back = result.reshape(o, kh, kw, cig).transpose(0, 3, 1, 2)

        def compute() -> None:
            np.copyto(x_in, x_t)
            np.copyto(cols, cols_src)
            np.copyto(g_buf, g_t)
            np.matmul(a, b, out=result)
            np.copyto(out, back)

        return compute

    def _bind_wide_rows(
        self, g: np.ndarray, x: np.ndarray, out: np.ndarray, db: np.ndarray | None
    ) -> Compute:
        """Stride 1, one group, a batch, rows wide enough (wide_rows_pay): the columns in
        whole padded rows (im2col_wide.py), laid out (K, images, OH * Wp) for a block of
        images whose columns stay in cache, times g copied channels-last into rows as wide
        as the padded input, (images * OH * Wp, O) with zeros in the extra positions: one
        product per block (a 14x14 map of 16 channels: the products alone 1.05-1.6x
        faster than one per image, the layer 3-6%), then one sum over the blocks and a copy of
        the (K, O) sum into the filter's layout. x is read NCHW in order: the
        channels-last copy of x the other paths make costs several times more when x is
        not in cache, as a training step's forward activations are not; g, written by the
        step before, is. (An infinite x in the extra positions would meet a zero of g
        there and give NaN.) With `db`, the columns get a row of ones (g is zero in the
        extra positions, so it sums g exactly)."""
        n = x.shape[0]
        o, k = out.shape[0], out[0].size
        oh, ow = self.win.out
        rows = WideRows(self.win, x.shape)
        xp, x_in = rows.padded(x.dtype)
        columns = rows.columns(xp)  # (N, C, kh, kw, L): reshaping it would copy
        kr, length = k + (db is not None), rows.length
        step = max(1, min(n, _WIDE_BLOCK_BYTES // (kr * length * x.itemsize)))
        # Flat, so a short last block is a whole (kr, m * L) matrix at its start.
        cols = temporary((kr * step * length,), x.dtype)
        # The product reads both operands as stored: (K, m * L) columns, (m * L, O) g.
        g_wide = np.zeros((step, oh, rows.width, o), g.dtype)
        g_in = g_wide[:, :, :ow, :].transpose(0, 3, 1, 2)
        g_t = g_wide.reshape(step * length, o)
        per_block = temporary((-(-n // step), kr, o), g.dtype)
        blocks = []
        for i in range(0, n, step):
            m = min(step, n - i)
            a = cols[: kr * m * length].reshape(kr, m * length)
            c_dst = a[:k].reshape(*columns.shape[1:4], m, length)
            c_src = columns[i : i + m].transpose(1, 2, 3, 0, 4)
            ones = a[k] if db is not None else None  # shared buffer: refilled per call
            part = per_block[i // step]
            blocks.append((g_in[:m], g[i : i + m], c_dst, c_src, ones, a, g_t[: m * length], part))
        total = temporary((kr, o), g.dtype)
        result = out.reshape(o, k)
        copies = [(result, total[:k].T)] + ([] if db is None else [(db, total[k])])

        def compute() -> None:
            np.copyto(x_in, x)
            for g_dst, g_src, c_dst, c_src, ones, a, b, part in blocks:
                np.copyto(g_dst, g_src)
                if ones is not None:
                    ones.fill(1)
                np.copyto(c_dst, c_src)
                np.matmul(a, b, out=part)
            np.sum(per_block, axis=0, out=total)
            for dst, src in copies:
                np.copyto(dst, src)

        return compute

    def _bind_image_blocks(
        self, g: np.ndarray, x: np.ndarray, out: np.ndarray, step: int
    ) -> Compute:
        """Small per-image products: channels-last columns for `step` images at a time,
        each image's product g (G, O/G, OH * OW) @ columns (G, OH * OW, K) taken while its
        columns are in cache and g read in place (NCHW is already (O, OH * OW) per image),
        then one sum over the batch."""
        win, groups = self.win, self.group
        n, c, h, wd = x.shape
        o, cig, kh, kw = out.shape
        cog, (oh, ow), k = o // groups, win.out, kh * kw * cig
        top, left = win.pads[:2]
        xp = np.zeros((n, *self.padded_shape[2:], c), x.dtype)
        x_in, x_t = xp[:, top : top + h, left : left + wd, :], x.transpose(0, 2, 3, 1)
        columns = _nhwc_columns(xp, win).reshape(n, oh, ow, kh, kw, groups, cig)
        columns = columns.transpose(0, 5, 1, 2, 3, 4, 6)
        cols = temporary((step, groups, oh, ow, kh, kw, cig), x.dtype)
        per_image = temporary((n, groups, cog, k), g.dtype)
        g4 = g.reshape(n, groups, cog, oh * ow)
        blocks = []
        for i in range(0, n, step):
            m = min(step, n - i)
            b = cols[:m].reshape(m, groups, oh * ow, k)
            blocks.append((cols[:m], columns[i : i + m], g4[i : i + m], b, per_image[i : i + m]))
        result = temporary((groups, cog, k), g.dtype)
        back = result.reshape(o, kh, kw, cig).transpose(0, 3, 1, 2)

        def compute() -> None:
            np.copyto(x_in, x_t)
            for dst, src, a, b, part in blocks:
                np.copyto(dst, src)
                np.matmul(a, b, out=part)
            np.sum(per_image, axis=0, out=result)
            np.copyto(out, back)

        return compute

    def _bind_planes(
        self, g: np.ndarray, x: np.ndarray, out: np.ndarray, db: np.ndarray | None
    ) -> Compute:
        """Few input channels per group (below NARROW_CHANNELS): channels-last columns
        would copy runs of a few floats, so the columns stay channels-first,
        (N, G, C/G * kh * kw, OH * OW), one whole-plane copy per tap, and g
        (N, G, O/G, OH * OW) times their transpose is one batched GEMM per image, summed
        over the batch; K ordered (C/G, kh, kw) is the filter's own layout. With `db`, each
        group's columns get a row of ones, whose column of the product sums g."""
        win, groups = self.win, self.group
        n = x.shape[0]
        o, cig, kh, kw = out.shape
        oh, ow = win.out
        xp = np.zeros(self.padded_shape, x.dtype)
        x_in = xp[self.interior]
        k = cig * kh * kw
        kr = k + (db is not None)
        full = temporary((n, groups, kr, oh * ow), x.dtype)
        cols = full[:, :, :k].reshape(n, groups, cig, kh, kw, oh, ow)
        ones = full[:, :, k] if db is not None else None  # shared buffer: refilled per call
        planes = xp.reshape(n, groups, cig, *xp.shape[2:])
        taps = [
            (cols[:, :, :, i, j], planes[:, :, :, rows, columns])
            for i in range(kh)
            for j in range(kw)
            for rows, columns in [win.tap(i, j)]
        ]
        a = g.reshape(n, groups, o // groups, oh * ow)
        b = full.transpose(0, 1, 3, 2)
        per_image = temporary((n, groups, o // groups, kr), g.dtype)
        if db is None:
            result, copies = out.reshape(groups, o // groups, k), []
        else:
            result = temporary((groups, o // groups, kr), g.dtype)
            copies = [
                (out.reshape(groups, o // groups, k), result[:, :, :k]),
                (db.reshape(groups, o // groups), result[:, :, k]),
            ]

        def compute() -> None:
            np.copyto(x_in, x)
            if ones is not None:
                ones.fill(1)
            for target, source in taps:
                np.copyto(target, source)
            np.matmul(a, b, out=per_image)
            np.sum(per_image, axis=0, out=result)
            for dst, src in copies:
                np.copyto(dst, src)

        return compute

    def _bind_depthwise(self, g: np.ndarray, x: np.ndarray, out: np.ndarray) -> Compute:
        """One input channel per group: per tap, a product of whole shifted planes summed
        over batch and positions (no column matrix)."""
        win = self.win
        n, c = x.shape[:2]
        o, _, kh, kw = out.shape
        mult = o // c
        xp = np.zeros(self.padded_shape, x.dtype)
        x_in = xp[self.interior]
        g5 = g.reshape(n, c, mult, *win.out)
        result = np.empty((kh, kw, c, mult), g.dtype)
        taps = [
            (xp[:, :, rows, cols], result[i, j])
            for i in range(kh)
            for j in range(kw)
            for rows, cols in [win.tap(i, j)]
        ]
        back = result.reshape(kh, kw, o).transpose(2, 0, 1)
        out3 = out.reshape(o, kh, kw)

        def compute() -> None:
            np.copyto(x_in, x)
            for plane, dst in taps:
                np.einsum("ncmhw,nchw->cm", g5, plane, out=dst)
            np.copyto(out3, back)

        return compute


def _with_bias_sum(main: Compute, g: np.ndarray, db: np.ndarray | None) -> Compute:
    """`main`, then the bias gradient summed from g when asked (paths whose columns carry
    no row of ones)."""
    if db is None:
        return main
    total = np.sum

    def compute() -> None:
        main()
        total(g, axis=(0, 2, 3), out=db)

    return compute


class Conv2DBackpropInput(_ConvGrad):
    """dx = col2im(g @ w), cropped to the unpadded input."""

    op = OpCode.CONV2D_BACKPROP_INPUT
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        g, w = self.require_float(0), self.require_float(1)
        x = self.optional_input(2)
        if x is not None:
            shape = x.shape
        else:
            given = attrs.ints("input_shape", None)
            if given is None or len(given) != 4 or min(given[1:]) < 1 or given[0] < -1:
                raise self.fail(
                    f"needs input 2 (a tensor shaped like x) or an input_shape "
                    f"attribute [N, C, H, W], got {given}"
                )
            shape = (g.shape[0] if given[0] == -1 else given[0], *given[1:])
        self._geometry(shape, w.shape, g)
        self.output_specs = [TensorSpec(tuple(shape), g.dtype)]

    def channels_last_input(self, index: int) -> ChannelsLast:
        # Every path reads g only through copies (into channels-last buffers, or scaled
        # planes) of views that split its channel axis, which any strides allow: g
        # stored channels-last (a decoder's upsampling after its last residual add) makes
        # the first copy contiguous instead of transposing.
        return ChannelsLast.ACCEPTED if index == 0 else ChannelsLast.REFUSED

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        g, w, out = required(inputs, 0), required(inputs, 1), outputs[0]
        if w.shape[1] == 1 and self.group > 1:  # depthwise (a lone channel: GEMM wins)
            return self._bind_depthwise(g, w, out)
        win, groups = self.win, self.group
        (dh, dw), (kh, kw) = win.dilations, win.kernel
        top, left, bottom, right = win.pads
        if (
            groups == 1
            and win.strides == (1, 1)
            and min(
                dh * (kh - 1) - top,
                dh * (kh - 1) - bottom,
                dw * (kw - 1) - left,
                dw * (kw - 1) - right,
            )
            >= 0
        ):
            return self._bind_correlation(g, w, out)
        o, cig, kh, kw = w.shape
        cog = o // groups
        n, c, h, wd = out.shape
        oh, ow = win.out
        p = n * oh * ow
        k = kh * kw * cig
        top, left = win.pads[:2]
        hp, wp = self.padded_shape[2:]
        # g as (G, P, O/G) and w as (G, O/G, K) with K ordered (kh, kw, C/G).
        g_buf = temporary((groups, n, oh, ow, cog), g.dtype)
        g_src = g.reshape(n, groups, cog, oh, ow).transpose(1, 0, 3, 4, 2)
        w_buf = temporary((groups, cog, kh, kw, cig), w.dtype)
        w_src = w.reshape(groups, cog, cig, kh, kw).transpose(0, 1, 3, 4, 2)
        cols = temporary((groups, p, k), g.dtype)
        a, b = g_buf.reshape(groups, p, cog), w_buf.reshape(groups, cog, k)
        cols7 = cols.reshape(groups, n, oh, ow, kh, kw, cig)
        if self._taps_tile(h, wd):
            return self._bind_tiling((g_src, w_src), (a, b, cols, w_buf), out)
        dxp = temporary((n, hp, wp, groups, cig), g.dtype)
        pairs = []
        for i in range(kh):
            for j in range(kw):
                rows, columns = win.tap(i, j)
                source = cols7[:, :, :, :, i, j].transpose(1, 2, 3, 0, 4)  # (N, OH, OW, G, C/G)
                pairs.append((dxp[:, rows, columns], source))
        interior = (
            dxp[:, top : top + h, left : left + wd].reshape(n, h, wd, c).transpose(0, 3, 1, 2)
        )

        def compute() -> None:
            np.copyto(g_buf, g_src)
            np.copyto(w_buf, w_src)
            np.matmul(a, b, out=cols)
            dxp.fill(0)
            for target, source in pairs:
                np.add(target, source, out=target)
            np.copyto(out, interior)

        return compute

    def _taps_tile(self, h: int, wd: int) -> bool:
        """Whether every dx position gets exactly one tap: kernel == stride, undilated,
        unpadded, and the taps cover the input (an upsampling layer's 2x2, stride 2)."""
        win = self.win
        (kh, kw), (oh, ow) = win.kernel, win.out
        return (
            win.strides == win.kernel
            and win.dilations == (1, 1)
            and not any(win.pads)
            and (oh * kh, ow * kw) == (h, wd)
        )

    def _bind_tiling(
        self,
        sources: tuple[np.ndarray, np.ndarray],
        gemm: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        out: np.ndarray,
    ) -> Compute:
        """The general path when the taps tile dx (_taps_tile): each tap's columns are
        copied straight into its strided positions of `out`, with no zeroed canvas, adds
        or crop; and g stored channels-last (G = 1) is already the GEMM's (P, O) operand,
        so it is not copied either. Same values: every position has one term."""
        (g_src, w_src), (a, b, cols, w_buf) = sources, gemm
        groups = a.shape[0]
        n, c, h, wd = out.shape
        (kh, kw), (oh, ow) = self.win.kernel, self.win.out
        cig = c // groups
        direct = g_src.flags.c_contiguous
        a_in = g_src.reshape(a.shape) if direct else a
        g_buf = a.reshape(g_src.shape)  # a view: `a` is a contiguous temporary
        cols7 = cols.reshape(groups, n, oh, ow, kh, kw, cig)
        planes = out.reshape(n, groups, cig, h, wd)
        copies = [
            (planes[:, :, :, i::kh, j::kw], cols7[:, :, :, :, i, j].transpose(1, 0, 4, 2, 3))
            for i in range(kh)
            for j in range(kw)
        ]
        copyto, matmul = np.copyto, np.matmul

        def compute() -> None:
            if not direct:
                copyto(g_buf, g_src)
            copyto(w_buf, w_src)
            matmul(a_in, b, out=cols)
            for dst, src in copies:
                copyto(dst, src)

        return compute

    def _bind_correlation(self, g: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        """Stride 1, one group: dx is the correlation of g, padded so every input position
        sees the whole kernel, with the flipped weights; columns of the channels-last
        padded g times (kh * kw * O, C) flipped weights is a GEMM with no scatter, run
        for blocks of images (images_per_block) so each block's columns stay in cache."""
        win = self.win
        o, c, kh, kw = w.shape
        n, _, h, wd = out.shape
        (dh, dw), (oh, ow) = win.dilations, win.out
        top, left = win.pads[:2]
        pt, pl = dh * (kh - 1) - top, dw * (kw - 1) - left
        gp = np.zeros((n, h + dh * (kh - 1), wd + dw * (kw - 1), o), g.dtype)
        g_in, g_t = gp[:, pt : pt + oh, pl : pl + ow, :], g.transpose(0, 2, 3, 1)
        sn, sh, sw, sc = gp.strides
        view = np.lib.stride_tricks.as_strided(
            gp,
            shape=(n, h, wd, kh, kw, o),
            strides=(sn, sh, sw, sh * dh, sw * dw, sc),
            writeable=False,
        )
        k = kh * kw * o
        step = images_per_block(n, h * wd * k * c)
        cols = temporary((step, h, wd, kh, kw, o), g.dtype)
        flipped = temporary((kh, kw, o, c), w.dtype)
        w_src = w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)
        result = temporary((n, h * wd, c), g.dtype)
        b = flipped.reshape(k, c)
        blocks = []
        for i in range(0, n, step):
            m = min(step, n - i)
            a, part = cols[:m].reshape(m * h * wd, k), result[i : i + m].reshape(m * h * wd, c)
            blocks.append((cols[:m], view[i : i + m], matmul_for(a, b, part), a, part))
        back = result.reshape(n, h, wd, c).transpose(0, 3, 1, 2)

        def compute() -> None:
            np.copyto(g_in, g_t)
            np.copyto(flipped, w_src)
            for dst, src, matmul, a, part in blocks:
                np.copyto(dst, src)
                matmul(a, b, out=part)
            np.copyto(out, back)

        return compute

    def _bind_depthwise(self, g: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        """One input channel per group: per tap, the gradient planes scaled by that tap's
        per-channel weights are added to the shifted input planes."""
        win = self.win
        n, c = out.shape[:2]
        o, _, kh, kw = w.shape
        mult = o // c
        dxp = np.empty(self.padded_shape, g.dtype)
        interior = dxp[self.interior]
        g5 = g.reshape(n, c, mult, *win.out)
        w4 = w.reshape(c, mult, kh, kw)
        scaled = np.empty((n, c, *win.out), g.dtype)
        taps = [
            (dxp[:, :, rows, cols], w4[:, :, i, j])
            for i in range(kh)
            for j in range(kw)
            for rows, cols in [win.tap(i, j)]
        ]
        w_col = np.empty((c, 1, 1), w.dtype)

        def compute() -> None:
            dxp.fill(0)
            for target, weights in taps:
                if mult == 1:
                    np.copyto(w_col[:, 0, 0], weights[:, 0])
                    np.multiply(g5[:, :, 0], w_col, out=scaled)
                else:
                    np.einsum("ncmhw,cm->nchw", g5, weights, out=scaled)
                np.add(target, scaled, out=target)
            np.copyto(out, interior)

        return compute
