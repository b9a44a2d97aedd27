"""Conv2D and ConvTranspose2D on NCHW float tensors (ONNX attribute semantics).

Conv2D picks one of five strategies when the model is planned:

- pointwise: a 1x1, stride-1, unpadded, ungrouped convolution is one GEMM per image on the
  (C, H*W) view of the input, with no copy at all;
- depthwise: group == in_channels == out_channels runs as kh*kw vectorised multiply-adds,
  each one contiguous NumPy call over all channels at once (see `depthwise.bind_depthwise`);
- winograd4 / winograd: a 3x3, stride-1, ungrouped convolution with constant weights and
  enough channels runs Winograd's F(4x4, 3x3) when it has many output tiles for its
  weights (1/4 of im2col's GEMM work), else F(2x2, 3x3) when the output is large enough
  (4/9 of the work); one implementation serves both (`_bind_winograd`);
- im2col: everything else. The column matrix is a strided view of the (padded) input,
  copied into a buffer allocated once in `bind`, then multiplied with the weights
  (pre-shaped to (groups, out/groups, in/groups*kh*kw)) by BLAS. Narrow outputs with many
  channels (the deep layers of a ResNet) build the columns channels-last instead, so
  the copy runs in rows of C elements rather than OW (`_bind_im2col_hwc`).

The bias and the fused activation are applied in place after the main step; a constant
bias is expanded to a whole output image once, so adding it is one contiguous pass.

Weights (out_ch, in_ch/group, kh, kw) may be constants or run-time tensors: every weight
view is taken in `bind`, where the arrays are final.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sporenet.lite.kernels.activation import fused_activation
from sporenet.lite.kernels.base import Attrs, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.depthwise import bind_depthwise
from sporenet.lite.kernels.spatial import Window, check_nchw, padded_buffer, window
from sporenet.lite.ops import OpCode


def im2col_view(xp: np.ndarray, win: Window) -> np.ndarray:
    """Read-only (N, C, kh, kw, OH, OW) view of a padded input: the column matrix of `win`."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    (kh, kw), (oh, ow) = win.kernel, win.out
    (th, tw), (dh, dw) = win.strides, win.dilations
    return np.lib.stride_tricks.as_strided(
        xp,
        shape=(n, c, kh, kw, oh, ow),
        strides=(sn, sc, sh * dh, sw * dw, sh * th, sw * tw),
        writeable=False,
    )


def phase_im2col_copies(
    xp: np.ndarray, win: Window, cols: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The copies that fill `cols` (N, C, kh, kw, OH, OW) for a strided, undilated window,
    through the input's stride phases.

    Copying columns straight from the input reads every row with the column stride,
    which NumPy does well below memory speed. Phase (a, b) = padded rows a, a+sh, ... and columns
    b, b+sw, ... is copied once; every tap (a + sh*u, b + sw*v) then reads unit-stride
    rows of its phase at offset (u, v), and the taps of one phase form one strided view,
    so the work is one strided pass over the input plus sh*sw contiguous copies (strided
    stems, e.g. 7x7 stride 2, gain most). The phase buffers are allocated here, once; the
    list runs in order.
    """
    n, c = xp.shape[:2]
    (kh, kw), (sh, sw), (oh, ow) = win.kernel, win.strides, win.out
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    for a in range(min(sh, kh)):
        for b in range(min(sw, kw)):
            part = xp[:, :, a::sh, b::sw]
            phase = np.empty(part.shape, xp.dtype)
            copies.append((phase, part))
            ku, kv = -(-(kh - a) // sh), -(-(kw - b) // sw)
            pn, pc, py, px = phase.strides
            taps = np.lib.stride_tricks.as_strided(
                phase,
                shape=(n, c, ku, kv, oh, ow),
                strides=(pn, pc, py, px, py, px),
                writeable=False,
            )
            copies.append((cols[:, :, a::sh, b::sw], taps))
    return copies


class Conv2D(Kernel):
    """2-D convolution: x (N, C, H, W), w (O, C/group, kh, kw), optional bias (O,).

    Attributes: strides, dilations, pads [top, left, bottom, right], auto_pad, group,
    kernel_shape (checked against the weights when given) and the fused `activation`.
    """

    op = OpCode.CONV2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w, bias, group = _conv_operands(self, "out_ch, in_ch/group")
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        if group < 1 or c % group or o % group:
            raise self.fail(
                f"group={group} must be positive and divide both the input channels ({c}) "
                f"and the output channels ({o})"
            )
        if cg * group != c:
            raise self.fail(
                f"input has {c} channels but weights {list(w.shape)} with group={group} "
                f"expect {cg * group}"
            )
        _check_filter(self, w, bias, o)
        if bias is not None and bias.dtype != x.dtype:
            raise self.fail(f"bias dtype {bias.dtype} differs from input dtype {x.dtype}")
        self.win = window(self, (h, wd), (kh, kw), attrs)
        self.group = group
        self.activation = fused_activation(self.op.name, attrs.values)
        self.output_specs = [TensorSpec((n, o, *self.win.out), x.dtype)]
        if kh == kw == 1 and self.win.strides == (1, 1) and not self.win.padded and group == 1:
            self.strategy = "pointwise"
        elif group == c == o:
            self.strategy = "depthwise"
        elif not (
            kh == kw == 3
            and self.win.strides == self.win.dilations == (1, 1)
            and group == 1
            and w.value is not None
            and (bias is None or bias.value is not None)
            and min(c, o) >= _WINOGRAD_MIN_CH
        ):
            self.strategy = "im2col"
        elif _winograd4_pays(n, c, o, self.win.out):
            self.strategy = "winograd4"
        elif (
            self.win.out[0] * self.win.out[1] >= _WINOGRAD_MIN_PLANE
            and min(c, o) * n * -(-self.win.out[0] // 2) * -(-self.win.out[1] // 2)
            >= _WINOGRAD_MIN_WORK
        ):
            self.strategy = "winograd"
        else:
            self.strategy = "im2col"

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w, out = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        if self.strategy in _WINOGRAD:
            main = self._bind_winograd(x, w, out, bias, _WINOGRAD[self.strategy])
            return _with_epilogue(main, out, None, self.activation, False)
        if self.strategy == "depthwise":
            # The depthwise step adds the bias while compacting its result into `out`.
            main = bind_depthwise(
                self.win,
                x,
                w,
                out,
                bias,
                w_const=self.inputs[1].value is not None,  # type: ignore[union-attr]
                bias_const=bias is not None and self.inputs[2].value is not None,
            )  # type: ignore[union-attr]
            return _with_epilogue(main, out, None, self.activation, False)
        bias_const = (
            len(self.inputs) > 2 and self.inputs[2] is not None and self.inputs[2].value is not None
        )
        if self.strategy == "pointwise" and bias_const and w.shape[0] > x.shape[1]:
            # Expanding 1x1 layers: copying the narrower input under a ones row is cheaper
            # than a bias pass over the wider output.
            main = self._bind_pointwise_with_bias(x, w, out, bias)  # type: ignore[arg-type]
            return _with_epilogue(main, out, None, self.activation, False)
        if self.strategy == "pointwise":
            main = self._bind_pointwise(x, w, out)
        elif bias_const and self.group == 1:
            # The bias rides in the GEMM: a column of ones under the im2col matrix.
            main = self._bind_im2col(x, w, out, bias)
            return _with_epilogue(main, out, None, self.activation, False)
        else:
            main = self._bind_im2col(x, w, out)
        return _with_epilogue(main, out, bias, self.activation, bias_const)

    def _bind_pointwise(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        n, c, h, wd = x.shape
        o = w.shape[0]
        w2 = w.reshape(o, c)
        matmul = np.matmul
        if n == 1:
            x2, out2 = x.reshape(c, h * wd), out.reshape(o, h * wd)
        else:
            x2, out2 = x.reshape(n, c, h * wd), out.reshape(n, o, h * wd)
        return lambda: matmul(w2, x2, out=out2)

    def _bind_pointwise_with_bias(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray
    ) -> Compute:
        n, c, h, wd = x.shape
        o = w.shape[0]
        full = np.ones((n, c + 1, h * wd), x.dtype)  # row c stays all ones
        rows = full[:, :c]
        x3 = x.reshape(n, c, h * wd)
        wmat = np.concatenate([w.reshape(o, c), bias.reshape(o, 1)], axis=1)
        cmat, omat = (full[0], out.reshape(o, -1)) if n == 1 else (full, out.reshape(n, o, -1))
        copyto, matmul = np.copyto, np.matmul

        def compute() -> None:
            copyto(rows, x3)
            matmul(wmat, cmat, out=omat)

        return compute

    def _bind_im2col(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None
    ) -> Compute:
        """Columns + GEMM; with a (constant, ungrouped) bias, the column matrix gets an
        extra row of ones and the packed weights the bias as an extra column."""
        win, g = self.win, self.group
        n = x.shape[0]
        o, cg, kh, kw = w.shape
        oh, ow = win.out
        copyto, matmul = np.copyto, np.matmul
        if (
            g == 1
            and ow <= _HWC_MAX_OW
            and x.shape[1] >= _HWC_MIN_CH
            and self.inputs[1].value is not None
        ):  # type: ignore[union-attr]
            return self._bind_im2col_hwc(x, w, out, bias)
        if win.padded:
            xp, interior = padded_buffer(x, win, 0.0)
        else:
            xp, interior = x, None
        src = im2col_view(xp, win)
        k = cg * kh * kw
        if bias is not None:
            full = np.ones((n, k + 1, oh * ow), x.dtype)  # row k stays all ones
            cols = _strided(
                full, src.shape, (full.strides[0], *_contiguous_strides(src.shape[1:], x.itemsize))
            )
            wmat = np.concatenate([w.reshape(o, k), bias.reshape(o, 1)], axis=1)
            cmat = full[0] if n == 1 else full
            omat = out.reshape(o, -1) if n == 1 else out.reshape(n, o, oh * ow)
        elif g == 1 and n == 1:
            # The common case as one plain 2-D GEMM: (O, K) @ (K, OH*OW).
            cols = np.empty(src.shape, x.dtype)
            wmat, cmat, omat = w.reshape(o, k), cols.reshape(k, oh * ow), out.reshape(o, -1)
        else:
            cols = np.empty(src.shape, x.dtype)
            wmat = w.reshape(g, o // g, k)
            cmat = cols.reshape(n, g, k, oh * ow)
            omat = out.reshape(n, g, o // g, oh * ow)
        # The copies that fill the columns: the padding's interior, then the columns
        # themselves (through the stride phases when the window is strided).
        copies = [] if interior is None else [(interior, x)]
        if win.strides != (1, 1) and win.dilations == (1, 1) and kh * kw > 1:
            copies += phase_im2col_copies(xp, win, cols)
        else:
            copies.append((cols, src))

        def compute() -> None:
            for dst, part in copies:
                copyto(dst, part)
            matmul(wmat, cmat, out=omat)

        return compute

    def _bind_im2col_hwc(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        """im2col for narrow outputs with many channels, built channels-last.

        With OW small, NCHW columns are copied in rows of OW elements (a 4x4 output of 512
        channels means 18k rows of 4). Transposing the input once to (N, H, W, C) makes
        the transposed column matrix (OH*OW, kh*kw*C) copy in rows of C elements; the
        weights are re-packed at bind to (O, kh, kw, C) order and BLAS reads the columns
        transposed, so the GEMM needs no extra copy.
        """
        win = self.win
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        (oh, ow), (sh, sw), (dh, dw) = win.out, win.strides, win.dilations
        top, left = win.pads[0], win.pads[1]
        hp, wp = (
            max(h + top + win.pads[2], win.extent[0]),
            max(wd + left + win.pads[3], win.extent[1]),
        )
        xp = np.zeros((n, hp, wp, c), x.dtype)
        interior = xp[:, top : top + h, left : left + wd, :]
        xt = x.transpose(0, 2, 3, 1)
        sn, sy, sx, sc = xp.strides
        src = np.lib.stride_tricks.as_strided(
            xp,
            shape=(n, oh, ow, kh, kw, c),
            strides=(sn, sy * sh, sx * sw, sy * dh, sx * dw, sc),
            writeable=False,
        )
        k = kh * kw * c
        wmat = w.transpose(0, 2, 3, 1).reshape(o, k)
        extra = 0 if bias is None else 1  # a ones column carries the bias through the GEMM
        full = np.ones((n, oh * ow, k + extra), x.dtype)
        cols = _strided(
            full,
            src.shape,
            (
                full.strides[0],
                ow * full.strides[1],
                full.strides[1],
                *_contiguous_strides((kh, kw, c), x.itemsize),
            ),
        )
        if bias is not None:
            wmat = np.concatenate([wmat, bias.reshape(o, 1)], axis=1)
        wmat = np.ascontiguousarray(wmat)
        if n == 1:
            cmat, omat = full[0].T, out.reshape(o, oh * ow)
        else:
            cmat, omat = full.transpose(0, 2, 1), out.reshape(n, o, oh * ow)
        copyto, matmul = np.copyto, np.matmul

        def compute() -> None:
            copyto(interior, xt)
            copyto(cols, src)
            matmul(wmat, cmat, out=omat)

        return compute

    def _bind_winograd(
        self,
        x: np.ndarray,
        w: np.ndarray,
        out: np.ndarray,
        bias: np.ndarray | None,
        f: WinogradTransform,
    ) -> Compute:
        """3x3 stride-1 convolution by Winograd's F(m x m, 3x3): (m+2)^2 products per m x m
        output tile and input channel instead of 9 m^2.

        Each output tile is A^T [(G w G^T) * (B^T d B)] A for its (m+2)^2 input tile d.
        The transforms are four small GEMMs against B^T and A^T, each one BLAS call over
        every tile and channel at once (F(4x4)'s matrices hold 4s, 5s and 8s, where
        additions would take about 22 passes each way): gather all input tiles
        channels-last with one strided copy, apply B^T to the tile rows and then to the
        tile columns, run the (m+2)^2 (tiles x C) @ (C x O) products, apply A^T twice, and
        copy the tiles into `out` (one copy when m divides the output size, else via a
        cropped buffer). U = G w G^T is computed once at bind, in float64. The bias is
        added once to the transformed position (1, 1), whose row and column of A^T are all
        ones, so it enters every output of a tile exactly once.
        """
        win = self.win
        n, c, h, wd = x.shape
        o = w.shape[0]
        oh, ow = win.out
        t, a = f.m, f.m + 2
        th, tw = -(-oh // t), -(-ow // t)  # a last row (column) of tiles may overhang
        tiles = n * th * tw
        top, left = win.pads[0], win.pads[1]
        xp = np.zeros((n, t * th + 2, t * tw + 2, c), x.dtype)
        interior, xt = xp[:, top : top + h, left : left + wd], x.transpose(0, 2, 3, 1)
        sn, sy, sx, sc = xp.strides
        tiles_in = np.lib.stride_tricks.as_strided(
            xp,
            shape=(a, a, n, th, tw, c),
            strides=(sy, sx, sn, t * sy, t * sx, sc),
            writeable=False,
        )
        u = np.einsum("ki,lj,ocij->klco", f.g, f.g, w.astype(np.float64))
        u = np.ascontiguousarray(u.reshape(a * a, c, o), dtype=x.dtype)
        bt, at = f.bt.astype(x.dtype), f.at.astype(x.dtype)
        d = np.empty((a, a, n, th, tw, c), x.dtype)
        e = np.empty((a, a * tiles * c), x.dtype)
        v = np.empty((a, a, tiles * c), x.dtype)
        m = np.empty((a * a, tiles, o), x.dtype)
        p = np.empty((t, a * tiles * o), x.dtype)
        y = np.empty((t, t, n, th, tw, o), x.dtype)
        d2, e3, v3 = d.reshape(a, -1), e.reshape(a, a, -1), v.reshape(a * a, tiles, c)
        m2, p3, y3, m11 = m.reshape(a, -1), p.reshape(t, a, -1), y.reshape(t, t, -1), m[a + 1]
        copyto, add, matmul = np.copyto, np.add, np.matmul
        if oh == t * th and ow == t * tw:
            # out (n, o, th, t, tw, t) seen as y's (t, t, n, th, tw, o): one copy.
            dest = out.reshape(n, o, th, t, tw, t).transpose(3, 5, 0, 2, 4, 1)

            def store() -> None:
                copyto(dest, y)
        else:
            res = np.empty((n, th, t, tw, t, o), x.dtype)
            res_view = res.transpose(2, 4, 0, 1, 3, 5)
            back = res.reshape(n, t * th, t * tw, o)[:, :oh, :ow].transpose(0, 3, 1, 2)

            def store() -> None:
                copyto(res_view, y)
                copyto(out, back)

        def compute() -> None:
            copyto(interior, xt)
            copyto(d, tiles_in)
            matmul(bt, d2, out=e)
            matmul(bt, e3, out=v)
            matmul(v3, u, out=m)
            if bias is not None:
                add(m11, bias, out=m11)
            matmul(at, m2, out=p)
            matmul(at, p3, out=y3)
            store()

        return compute


# When Winograd pays is measured, not derived: benchmarks/conv_strategies.py times the
# three strategies on the layers at these edges and shows which one each layer picks.
#
# Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions with outputs of at least this many
# positions and at least this many input channels. The transformed weights take 16/9 of
# the originals' memory and OpenBLAS re-packs them on every call, so with very few tiles
# the saved multiplications stop paying (the largest layers on the smallest planes stay
# on im2col, which also keeps their weights at their original size).
_WINOGRAD_MIN_PLANE = 36
# The transforms cost a few passes over the input and output tiles per call whatever the
# channel counts, while the GEMMs save 5/9 of the C*O work per tile: with few channels,
# or few tiles (N * ceil(OH/2) * ceil(OW/2)) times channels, the transforms eat the saving.
_WINOGRAD_MIN_CH = 32
_WINOGRAD_MIN_WORK = 3000
# Winograd F(4x4, 3x3) stores 36/9 of the weights' size and OpenBLAS re-packs them on
# every call, so it needs enough 4x4 tiles per weight byte; with few tiles and large
# weights F(2x2) wins.
_WINOGRAD4_MIN_TILES = 16
_WINOGRAD4_MANY_TILES = 36
_WINOGRAD4_MAX_WEIGHTS = 128 * 128


def _winograd4_pays(n: int, c: int, o: int, out_hw: tuple[int, int]) -> bool:
    """Whether F(4x4, 3x3) beats F(2x2, 3x3) and im2col on this layer (see above)."""
    tiles = n * -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
    return tiles >= _WINOGRAD4_MANY_TILES or (
        tiles >= _WINOGRAD4_MIN_TILES and c * o <= _WINOGRAD4_MAX_WEIGHTS
    )


# General convolutions with outputs at most this wide and at least this many input
# channels build their columns channels-last (see `_bind_im2col_hwc`).
_HWC_MAX_OW = 16
_HWC_MIN_CH = 32
# Largest bias expanded to a full output plane, for the same reason.
_BIAS_EXPAND_LIMIT = 1 << 20


@dataclass(frozen=True)
class WinogradTransform:
    """Winograd's F(m x m, 3x3): output tile m, input tile m + 2, and the matrices B^T
    ((m+2) x (m+2)), G ((m+2) x 3) and A^T (m x (m+2)). Position (1, 1) of the transformed
    tile must have all-ones columns in A^T (the bias enters there)."""

    m: int
    bt: np.ndarray
    g: np.ndarray
    at: np.ndarray


F2X2 = WinogradTransform(
    m=2,
    bt=np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
    g=np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
    at=np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64),
)
# Lavin and Gray's F(4x4, 3x3), interpolation points 0, +-1, +-2.
F4X4 = WinogradTransform(
    m=4,
    bt=np.array(
        [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ],
        dtype=np.float64,
    ),
    g=np.array(
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ]
    ),
    at=np.array(
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
        dtype=np.float64,
    ),
)
# Conv2D strategy name -> its Winograd transform.
_WINOGRAD = {"winograd": F2X2, "winograd4": F4X4}


def _conv_operands(
    kernel: Kernel,
    weight_axes: str,
) -> tuple[TensorSpec, TensorSpec, TensorSpec | None, int]:
    """The checked (x, w, bias, group) both convolutions start from: a float NCHW input,
    4-D weights (`weight_axes`, kh, kw) of the input's dtype, an optional bias."""
    x, w = kernel.require_float(0), kernel.require_float(1)
    bias = kernel.optional_input(2)
    check_nchw(kernel, x.shape)
    if w.rank != 4:
        raise kernel.fail(f"weights must be 4-D ({weight_axes}, kh, kw), got shape {list(w.shape)}")
    if x.dtype != w.dtype:
        raise kernel.fail(f"input dtype {x.dtype} differs from weight dtype {w.dtype}")
    return x, w, bias, kernel.attrs.int("group", 1)


def _check_filter(kernel: Kernel, w: TensorSpec, bias: TensorSpec | None, out_ch: int) -> None:
    """kernel_shape, when given, must match the weights; the bias has one value per output
    channel."""
    kh, kw = w.shape[2:]
    kernel_shape = kernel.attrs.ints("kernel_shape", None)
    if kernel_shape is not None and list(kernel_shape) != [kh, kw]:
        raise kernel.fail(f"kernel_shape {kernel_shape} differs from the weights' {[kh, kw]}")
    if bias is not None and bias.shape != (out_ch,):
        raise kernel.fail(f"bias must have shape [{out_ch}], got {list(bias.shape)}")


def _contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def _strided(base: np.ndarray, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """A writable view of `base` with explicit shape and strides (within its bounds)."""
    return np.lib.stride_tricks.as_strided(base, shape=tuple(shape), strides=tuple(strides))


def _with_epilogue(
    main: Compute, out: np.ndarray, bias: np.ndarray | None, act: object, bias_const: bool
) -> Compute:
    """Wrap a convolution step with the bias add and the fused activation (both in place).

    A constant bias is expanded once to a whole output image when that is small, so the add
    is one contiguous pass instead of a broadcast over short rows.
    """
    if bias is None and act is None:
        return main
    b = None
    target = out
    if bias is not None:
        n, o = out.shape[:2]
        plane = out[0, 0].size
        target = out.reshape(n, o * plane)
        if bias_const and o * plane * out.itemsize <= _BIAS_EXPAND_LIMIT:
            b = np.repeat(bias, plane)
        else:
            target, b = out.reshape(n, o, plane), bias.reshape(o, 1)
    add = np.add
    if act is None:

        def with_bias() -> None:
            main()
            add(target, b, out=target)

        return with_bias
    if b is None:

        def with_act() -> None:
            main()
            act(out)  # type: ignore[operator]

        return with_act

    def with_both() -> None:
        main()
        add(target, b, out=target)
        act(out)  # type: ignore[operator]

    return with_both


class ConvTranspose2D(Kernel):
    """Transposed 2-D convolution (ONNX ConvTranspose): x (N, C, H, W), w (C, O/group, kh,
    kw), optional bias (O,).

    Attributes: strides, dilations, pads [top, left, bottom, right], output_padding,
    group, kernel_shape and the fused `activation`; auto_pad NOTSET or VALID (the SAME
    modes and `output_shape` are refused: converters resolve them to explicit pads).
    One GEMM gives every input pixel's contribution to each kernel tap (col2im columns);
    kh*kw strided adds scatter them onto a zeroed canvas, which is cropped by the pads.
    """

    op = OpCode.CONV_TRANSPOSE2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w, bias, group = _conv_operands(self, "in_ch, out_ch/group")
        n, c, h, wd = x.shape
        if group < 1 or c % group:
            raise self.fail(f"group={group} must be positive and divide the input channels ({c})")
        if w.shape[0] != c:
            raise self.fail(
                f"input has {c} channels but weights {list(w.shape)} expect {w.shape[0]}"
            )
        o = w.shape[1] * group
        kh, kw = w.shape[2:]
        _check_filter(self, w, bias, o)
        auto_pad = attrs.str("auto_pad", "NOTSET")
        if auto_pad not in ("NOTSET", "VALID") or attrs.ints("output_shape", None) is not None:
            raise self.fail(
                "only explicit pads are supported (auto_pad NOTSET or VALID, no output_shape)"
            )
        strides = attrs.ints("strides", [1, 1])
        dilations = attrs.ints("dilations", [1, 1])
        pads = [0, 0, 0, 0] if auto_pad == "VALID" else attrs.ints("pads", [0, 0, 0, 0])
        out_pad = attrs.ints("output_padding", [0, 0])
        for name, values, size, low in (
            ("strides", strides, 2, 1),
            ("dilations", dilations, 2, 1),
            ("pads", pads, 4, 0),
            ("output_padding", out_pad, 2, 0),
        ):
            if len(values) != size or any(v < low for v in values):
                raise self.fail(f"{name} must hold {size} values >= {low}, got {values}")
        if any(p >= s and p >= d for p, s, d in zip(out_pad, strides, dilations, strict=True)):
            raise self.fail(
                f"output_padding {out_pad} must be smaller than the strides "
                f"{strides} or the dilations {dilations}"
            )
        canvas = [
            s * (i - 1) + (k - 1) * d + 1 + p
            for s, i, k, d, p in zip(strides, (h, wd), (kh, kw), dilations, out_pad, strict=True)
        ]
        out_hw = [canvas[0] - pads[0] - pads[2], canvas[1] - pads[1] - pads[3]]
        if min(out_hw) < 1:
            raise self.fail(f"pads {pads} leave no output (uncropped size {canvas})")
        self.strides, self.dilations, self.pads = strides, dilations, pads
        self.canvas, self.group = tuple(canvas), group
        self.activation = fused_activation(self.op.name, attrs.values)
        self.output_specs = [TensorSpec((n, o, *out_hw), x.dtype)]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w, out = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        n, c, h, wd = x.shape
        g = self.group
        cg, og, kh, kw = c // g, w.shape[1], w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = self.strides, self.dilations
        # (g, og*kh*kw, cg): each group's weights transposed, so cols = wt @ x.
        wt = w.reshape(g, cg, og * kh * kw).transpose(0, 2, 1)
        if self.inputs[1].value is not None:  # type: ignore[union-attr]
            wt = np.ascontiguousarray(wt)
        xg = x.reshape(n, g, cg, h * wd)
        cols = np.empty((n, g, og * kh * kw, h * wd), x.dtype)
        taps = cols.reshape(n, g * og, kh, kw, h, wd)
        canvas = np.empty((n, g * og, *self.canvas), x.dtype)
        adds = [
            (
                canvas[
                    :,
                    :,
                    i * dh : i * dh + sh * (h - 1) + 1 : sh,
                    j * dw : j * dw + sw * (wd - 1) + 1 : sw,
                ],
                taps[:, :, i, j],
            )
            for i in range(kh)
            for j in range(kw)
        ]
        top, left = self.pads[0], self.pads[1]
        oh, ow = out.shape[2:]
        crop = canvas[:, :, top : top + oh, left : left + ow]
        matmul, add, copyto = np.matmul, np.add, np.copyto

        def main() -> None:
            matmul(wt, xg, out=cols)
            canvas.fill(0)
            for dst, src in adds:
                add(dst, src, out=dst)
            copyto(out, crop)

        bias_const = bias is not None and self.inputs[2].value is not None  # type: ignore
        return _with_epilogue(main, out, bias, self.activation, bias_const)
