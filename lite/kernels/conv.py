"""Conv2D on NCHW float tensors (ONNX attribute semantics): the choice of strategy.

Conv2D picks one of five strategies when the model is planned:

- pointwise: a 1x1, stride-1, unpadded, ungrouped convolution is one GEMM per image on the
  (C, H*W) view of the input, with no copy at all;
- depthwise: group == in_channels == out_channels runs as kh*kw vectorised multiply-adds,
  each one contiguous NumPy call over all channels at once (see `depthwise.bind_depthwise`);
- winograd4 / winograd: a 3x3, stride-1, ungrouped convolution with constant weights and
  enough channels runs Winograd's F(4x4, 3x3) when it has many output tiles for its
  weights (1/4 of im2col's GEMM work), else F(2x2, 3x3) when the output is large enough
  (4/9 of the work); one implementation serves both (`winograd.bind_winograd`);
- im2col: everything else. The column matrix is a strided view of the (padded) input,
  copied into a buffer allocated once in `bind`, then multiplied with the weights
  (pre-shaped to (groups, out/groups, in/groups*kh*kw)) by BLAS. Narrow outputs with many
  channels (the deep layers of a ResNet) build the columns channels-last instead, so
  the copy runs in rows of C elements rather than OW (`im2col.bind_im2col_hwc`).

Between convolutions, the planner may store a tensor channels-last (an NCHW view of NHWC
memory) when its producer and readers agree (Kernel.channels_last_input/output): the
depthwise einsum then reads and writes it without transposing copies, Winograd gathers
and scatters its tiles in rows of channels, and a 1x1 GEMM reads or writes it as the
transposed (H*W, C) matrix, at no cost. A 1x1 layer reading channels-last rows writes
channels-last rows too (Conv2D.channels_last_follows), unless it widens with a bias
over a large output, which is faster from NCHW rows (Conv2D.leans_nchw); so does an
im2col layer on one image with a small column matrix, which builds it channels-last
from such an input. 2-D GEMMs go through `conv_common.gemm`, which splits products just
above OpenBLAS's unpacked-kernel limit.

The bias and the fused activation are applied in place after the main step
(`conv_common.with_epilogue`, shared with ConvTranspose2D in conv_transpose.py).

Weights (out_ch, in_ch/group, kh, kw) may be constants or run-time tensors: every weight
view is taken in `bind`, where the arrays are final.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels.activation import fused_activation
from sporenet.lite.kernels.base import Attrs, ChannelsLast, Compute, Kernel, TensorSpec
from sporenet.lite.kernels.conv_common import (
    check_filter,
    conv_operands,
    gemm,
    is_channels_last,
    with_epilogue,
)
from sporenet.lite.kernels.depthwise import bind_depthwise, uses_channels_last
from sporenet.lite.kernels.im2col import bind_im2col, bind_im2col_hwc
from sporenet.lite.kernels.spatial import Window, window
from sporenet.lite.kernels.winograd import F2X2, F4X4, bind_winograd
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.ops import OpCode


class Conv2D(Kernel):
    """2-D convolution: x (N, C, H, W), w (O, C/group, kh, kw), optional bias (O,).

    Attributes: strides, dilations, pads [top, left, bottom, right], auto_pad, group,
    kernel_shape (checked against the weights when given) and the fused `activation`.
    """

    op = OpCode.CONV2D
    num_inputs = (2, 3)

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, w, bias, group = conv_operands(self, "out_ch, in_ch/group")
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
        check_filter(self, w, bias, o)
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
            and min(c, o) >= _winograd_min_channels(self.win.out)
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
        # How this layer takes channels-last tensors (see Kernel.channels_last_input): the
        # depthwise einsum and the transposing first copy of Winograd and channels-last
        # im2col gain from it, a 1x1 GEMM reads and writes either layout.
        # (A depthwise layer runs channels-last whenever its input is stored so.)
        depthwise_last = self.strategy == "depthwise" and uses_channels_last(
            self.win, x.shape, x.dtype.itemsize, stored_last=True
        )
        self._hwc_from_last = False
        if depthwise_last or self.strategy in _WINOGRAD:
            # Winograd gathers its input tiles and scatters its output tiles channels-last:
            # NCHW on either side costs a transposing copy.
            self._out_last = self._in_last = ChannelsLast.PREFERRED
        elif self.strategy == "pointwise" and w.value is not None:
            # (Its channels-last GEMM re-packs the weights at bind: they must be constant.)
            self._out_last = self._in_last = ChannelsLast.ACCEPTED
        else:
            # Plain im2col on one image writes either layout (its GEMM transposed, with
            # the weights re-packed at bind, so constant); the bias must be a constant or
            # absent (a run-time bias is added on NCHW rows).
            plain = (
                self.strategy == "im2col"
                and not self._im2col_hwc(c)
                and group == 1
                and n == 1
                and w.value is not None
                and (bias is None or bias.value is not None)
            )
            self._out_last = ChannelsLast.ACCEPTED if plain else ChannelsLast.REFUSED
            # Such a layer with a column matrix small enough to build whole builds it
            # channels-last from an input stored so (no transposing copy), and its GEMM
            # then writes channels-last rows as they come.
            small = _im2col_bytes(self.win, c, x.dtype) <= _HWC_LAST_BYTES
            self._hwc_from_last = plain and small
            if self._im2col_hwc(c):
                self._in_last = ChannelsLast.PREFERRED
            elif self._hwc_from_last:
                self._in_last = ChannelsLast.ACCEPTED
            else:
                self._in_last = ChannelsLast.REFUSED

    def channels_last_input(self, index: int) -> ChannelsLast:
        return self._in_last if index == 0 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return self._out_last if index == 0 else ChannelsLast.REFUSED

    def leans_nchw(self, index: int) -> bool:
        # A widening 1x1 layer with a constant bias carries the bias through its GEMM
        # under a copy of NCHW input rows; from channels-last rows it needs an extra pass
        # over its output (worth avoiding when that output is large).
        out = self.output_specs[0]
        bias = self.optional_input(2)
        return (
            index == 0
            and self.strategy == "pointwise"
            and out.shape[1] > self.input(0).shape[1]
            and bias is not None
            and bias.value is not None
            and out.size * out.dtype.itemsize >= _LEAN_NCHW_BYTES
        )

    def channels_last_follows(self, index: int) -> int | None:
        # A 1x1 GEMM reading channels-last rows writes channels-last rows faster than
        # NCHW ones (the plain row-major product against a transposed one), so its output
        # keeps the input's layout.
        # So does a layer building its columns channels-last from channels-last input.
        follows = (self.strategy == "pointwise" and self._out_last) or self._hwc_from_last
        return 0 if follows else None

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w, out = inputs[0], inputs[1], outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        if self.strategy in _WINOGRAD:
            main = bind_winograd(self.win, x, w, out, bias, _WINOGRAD[self.strategy])
            pages.release(w)  # the step reads the transformed weights, not these
            dense = out.transpose(0, 2, 3, 1) if is_channels_last(out) else out
            return with_epilogue(main, dense, None, self.activation, False)
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
                act=self.activation,
            )  # type: ignore[union-attr]
            return main
        bias_const = (
            len(self.inputs) > 2 and self.inputs[2] is not None and self.inputs[2].value is not None
        )
        if self.strategy == "pointwise" and (is_channels_last(x) or is_channels_last(out)):
            return self._bind_pointwise_last(x, w, out, bias)
        if (
            self.strategy == "pointwise"
            and x.shape[0] == 1
            and x.shape[2] * x.shape[3] <= _HEAD_MAX_PLANE
            and w.size * w.itemsize >= _HEAD_MIN_WEIGHT_BYTES
            and self.inputs[1].value is not None  # type: ignore[union-attr]
        ):
            return self._bind_pointwise_head(x, w, out, bias)
        if self.strategy == "pointwise" and bias_const and w.shape[0] > x.shape[1]:
            # Expanding 1x1 layers: copying the narrower input under a ones row is cheaper
            # than a bias pass over the wider output.
            main = self._bind_pointwise_with_bias(x, w, out, bias)  # type: ignore[arg-type]
            return with_epilogue(main, out, None, self.activation, False)
        if self.strategy == "pointwise":
            main = self._bind_pointwise(x, w, out)
        elif bias_const and self.group == 1:
            # The bias rides in the GEMM: a column of ones under the im2col matrix.
            main = self._bind_im2col(x, w, out, bias)
            dense = out.transpose(0, 2, 3, 1) if is_channels_last(out) else out
            return with_epilogue(main, dense, None, self.activation, False)
        else:
            main = self._bind_im2col(x, w, out)
            if bias is None and is_channels_last(out):
                return with_epilogue(main, out.transpose(0, 2, 3, 1), None, self.activation, False)
        return with_epilogue(main, out, bias, self.activation, bias_const)

    def _bind_pointwise(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
        n, c, h, wd = x.shape
        o = w.shape[0]
        w2 = w.reshape(o, c)
        matmul = np.matmul
        if n == 1:
            return gemm(w2, x.reshape(c, h * wd), out.reshape(o, h * wd))
        x2, out2 = x.reshape(n, c, h * wd), out.reshape(n, o, h * wd)
        return lambda: matmul(w2, x2, out=out2)

    def _bind_pointwise_last(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        """The 1x1 GEMM when the input or the output is stored channels-last.

        A channels-last tensor is the (H*W, C) matrix of an NCHW one transposed, which BLAS
        reads (or writes) as it is, so no layout is converted. The weights are re-packed
        once to (C, O) order, which OpenBLAS multiplies fastest with these operands. A
        channels-last output takes its constant bias in the GEMM (a ones row under a copy
        of an NCHW input) or in one contiguous pass, and the activation on its rows.
        """
        n, c, h, wd = x.shape
        o, hw = w.shape[0], h * wd
        bias_const = bias is not None and self.inputs[2].value is not None  # type: ignore[union-attr]
        wt = np.ascontiguousarray(w.reshape(o, c).T)  # (C, O)
        add, copyto, act = np.add, np.copyto, self.activation
        if is_channels_last(x):
            rows = x.transpose(0, 2, 3, 1).reshape(n, hw, c)  # (N, H*W, C)
        else:
            rows = x.reshape(n, c, hw).transpose(0, 2, 1)
        if not is_channels_last(out):
            om = out.reshape(n, o, hw)
            cols, w2 = rows.transpose(0, 2, 1), wt.T
            product = gemm(w2, cols[0], om[0]) if n == 1 else gemm(w2, cols, om)
            return with_epilogue(product, out, bias, act, bias_const)
        dense = out.transpose(0, 2, 3, 1)  # contiguous (N, H, W, O)
        om = dense.reshape(n, hw, o)
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        b, target = None, om
        ones = None
        if bias_const and not is_channels_last(x):
            full = temporary((n, c + 1, hw), x.dtype)
            ones = full[:, c]  # rewritten every call: the buffer is shared with other steps
            copies.append((full[:, :c], x.reshape(n, c, hw)))
            rows = full.transpose(0, 2, 1)
            wt = np.concatenate([wt, bias.reshape(1, o)])  # type: ignore[union-attr]
        elif bias_const and hw * o * out.itemsize <= _BIAS_TILE_LIMIT:
            # One contiguous pass instead of a broadcast over rows of O elements.
            b, target = np.tile(bias, hw), dense.reshape(n, hw * o)  # type: ignore[arg-type]
        elif bias is not None:
            b = bias
        product = gemm(rows[0], wt, om[0]) if n == 1 else gemm(rows, wt, om)

        pages.release_unless_read(w, wt)

        def compute() -> None:
            if ones is not None:
                ones.fill(1)
            for dst, src in copies:
                copyto(dst, src)
            product()
            if b is not None:
                add(target, b, out=target)
            if act is not None:
                act(dense)

        return compute

    def _bind_pointwise_head(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        """A 1x1 layer with large weights over a few positions (MobileNet's 1280-channel
        head on a 3x3 map): OpenBLAS re-packs the (O, C) operand on every call, which
        for weights that left the cache costs more than the product, while the (C, O)
        operand of the transposed product out^T = x^T W^T streams once. The (H*W, O)
        result is then copied into `out`, with the bias added in the same pass."""
        _, c, h, wd = x.shape
        o = w.shape[0]
        wt = np.ascontiguousarray(w.reshape(o, c).T)  # (C, O)
        xt = x.reshape(c, h * wd).T
        rows = temporary((h * wd, o), x.dtype)
        result, out2 = rows.T, out.reshape(o, h * wd)
        b = None if bias is None else bias.reshape(o, 1)
        add, copyto, act = np.add, np.copyto, self.activation
        product = gemm(xt, wt, rows)

        pages.release_unless_read(w, wt)

        def compute() -> None:
            product()
            if b is None:
                copyto(out2, result)
            else:
                add(result, b, out=out2)
            if act is not None:
                act(out)

        return compute

    def _bind_pointwise_with_bias(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray
    ) -> Compute:
        n, c, h, wd = x.shape
        o = w.shape[0]
        full = temporary((n, c + 1, h * wd), x.dtype)
        rows, ones = full[:, :c], full[:, c]  # ones rewritten every call (shared buffer)
        x3 = x.reshape(n, c, h * wd)
        wmat = np.concatenate([w.reshape(o, c), bias.reshape(o, 1)], axis=1)
        cmat, omat = (full[0], out.reshape(o, -1)) if n == 1 else (full, out.reshape(n, o, -1))
        copyto, product = np.copyto, gemm(wmat, cmat, omat)

        pages.release_unless_read(w, wmat)

        def compute() -> None:
            ones.fill(1)
            copyto(rows, x3)
            product()

        return compute

    def _bind_im2col(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None
    ) -> Compute:
        """Columns + GEMM, built channels-last for narrow outputs with many channels and
        for small column matrices of channels-last inputs."""
        if self._im2col_hwc(x.shape[1]) or (self._hwc_from_last and is_channels_last(x)):
            return bind_im2col_hwc(self.win, x, w, out, bias)
        return bind_im2col(self.win, self.group, x, w, out, bias)

    def _im2col_hwc(self, channels: int) -> bool:
        """Whether the im2col strategy builds its columns channels-last."""
        return (
            self.strategy == "im2col"
            and self.group == 1
            and self.win.out[1] <= _HWC_MAX_OW
            and channels >= _HWC_MIN_CH
            and self.inputs[1].value is not None  # type: ignore[union-attr]
        )


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
# On a small plane Winograd's tile buffers are small too, and F(4x4) pays from fewer
# channels (a text line's 24 channels on 32x80); on large planes those buffers cost more
# memory than the time they save.
_WINOGRAD_MIN_CH = 32
_WINOGRAD_SMALL_PLANE = 64 * 64
_WINOGRAD_SMALL_PLANE_MIN_CH = 16
_WINOGRAD_MIN_WORK = 2000
# Winograd F(4x4, 3x3) stores 36/9 of the weights' size and OpenBLAS re-packs them on
# every call, so it needs enough 4x4 tiles per weight byte; with few tiles and large
# weights F(2x2) wins. Up to 128x128 channels it wins from four tiles on (a 7x7 plane,
# or a text line's 8x20).
_WINOGRAD4_MIN_TILES = 4
_WINOGRAD4_MANY_TILES = 36
_WINOGRAD4_MAX_WEIGHTS = 128 * 128


def _winograd_min_channels(out_hw: tuple[int, int]) -> int:
    """The fewest channels (in and out) for which Winograd can pay on this output plane."""
    small = out_hw[0] * out_hw[1] <= _WINOGRAD_SMALL_PLANE
    return _WINOGRAD_SMALL_PLANE_MIN_CH if small else _WINOGRAD_MIN_CH


def _winograd4_pays(n: int, c: int, o: int, out_hw: tuple[int, int]) -> bool:
    """Whether F(4x4, 3x3) beats F(2x2, 3x3) and im2col on this layer (see above)."""
    tiles = n * -(-out_hw[0] // 4) * -(-out_hw[1] // 4)
    return tiles >= _WINOGRAD4_MANY_TILES or (
        tiles >= _WINOGRAD4_MIN_TILES and c * o <= _WINOGRAD4_MAX_WEIGHTS
    )


# General convolutions with outputs at most this wide and at least this many input
# channels build their columns channels-last (see `im2col.bind_im2col_hwc`).
_HWC_MAX_OW = 16
_HWC_MIN_CH = 32
# Largest column matrix (bytes) built channels-last from any channels-last input: it is
# built whole, where a larger NCHW one is built in blocks of rows (im2col._BLOCK_BYTES).
_HWC_LAST_BYTES = 1 << 20


def _im2col_bytes(win: Window, channels: int, dtype: np.dtype) -> int:
    """Bytes of a convolution's whole column matrix (one image, a row for the bias)."""
    kh, kw = win.kernel
    return win.out[0] * win.out[1] * (channels * kh * kw + 1) * dtype.itemsize


# 1x1 layers over at most this many positions with weights of at least this many bytes
# multiply transposed (see Conv2D._bind_pointwise_head).
_HEAD_MAX_PLANE = 16
_HEAD_MIN_WEIGHT_BYTES = 512 << 10

# Smallest output (bytes) of a widening 1x1 layer with a constant bias that leans NCHW
# (see Conv2D.leans_nchw).
_LEAN_NCHW_BYTES = 128 << 10

# Largest channels-last 1x1 output (bytes) whose constant bias is tiled to the whole image.
_BIAS_TILE_LIMIT = 1 << 20

# Conv2D strategy name -> its Winograd transform.
_WINOGRAD = {"winograd": F2X2, "winograd4": F4X4}
