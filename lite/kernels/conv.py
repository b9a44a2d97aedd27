"""Conv2D on NCHW float tensors (ONNX attribute semantics) and its strategies.

Conv2D checks the layer, asks `conv_strategy.choose` for one of five strategies when the
model is planned, and hands the layer to that strategy's class here, which says which
layouts it takes (Kernel.channels_last_*) and binds the step:

- pointwise: a 1x1, stride-1, unpadded, ungrouped convolution is one GEMM per image on the
  (C, H*W) view of the input, with no copy at all (`pointwise.py`);
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
view is taken in `bind`, where the arrays are final. Constant weights lose their dead
taps (those reading only padding at this input size, dead_taps.py) when the layer is
planned: the strategy then sees the smaller window, with its padding shrunk to match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels.activation import InPlace, fused_activation, with_scratch
from sporenet.lite.kernels.base import Attrs, ChannelsLast, Compute, Kernel, TensorSpec, required
from sporenet.lite.kernels.conv_common import (
    check_filter,
    conv_operands,
    is_channels_last,
    with_epilogue,
)
from sporenet.lite.kernels.conv_strategy import ConvLayer, ConvStrategy, choose
from sporenet.lite.kernels.dead_taps import trim_window
from sporenet.lite.kernels.depthwise import bind_depthwise, uses_channels_last
from sporenet.lite.kernels.im2col import bind_im2col, bind_im2col_hwc, in_image_blocks
from sporenet.lite.kernels.pointwise import (
    bind_pointwise,
    bind_pointwise_head,
    bind_pointwise_last,
    bind_pointwise_with_bias,
)
from sporenet.lite.kernels.spatial import Window, window
from sporenet.lite.kernels.winograd import F2X2, F4X4, bind_winograd
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
        win = window(self, (h, wd), (kh, kw), attrs)
        # The live taps of a window with dead ones (dead_taps.py), sliced from the
        # weights once in `bind`; None when every tap is kept.
        self.taps: tuple[slice, slice] | None = None
        if w.value is not None and attrs.str("auto_pad", "NOTSET") == "NOTSET":
            trimmed = _trimmed(win, (h, wd), w.value)
            if trimmed is not None:
                win, self.taps = trimmed
                kh, kw = win.kernel
        self.win = win
        self.group = group
        self.activation = fused_activation(self.op.name, attrs.values)
        self.output_specs = [TensorSpec((n, o, *self.win.out), x.dtype)]
        self.layer = ConvLayer(
            batch=n,
            in_channels=c,
            out_channels=o,
            group=group,
            kernel=(kh, kw),
            strides=self.win.strides,
            dilations=self.win.dilations,
            padded=self.win.padded,
            out=self.win.out,
            const_weights=w.value is not None,
            has_bias=bias is not None,
            const_bias=bias is not None and bias.value is not None,
        )
        self.force_strategy(choose(self.layer))

    def force_strategy(self, strategy: ConvStrategy) -> None:
        """Run this layer with `strategy` (chosen at planning; benchmarks time each)."""
        self.strategy = ConvStrategy(strategy)
        self._path = _PATHS[self.strategy](self)

    def channels_last_input(self, index: int) -> ChannelsLast:
        return self._path.in_last if index == 0 else ChannelsLast.REFUSED

    def channels_last_output(self, index: int) -> ChannelsLast:
        return self._path.out_last if index == 0 else ChannelsLast.REFUSED

    def leans_nchw(self, index: int) -> bool:
        return index == 0 and self._path.leans_nchw

    def channels_last_follows(self, index: int) -> int | None:
        return 0 if self._path.follows else None

    def reads_strided(self, index: int) -> bool:
        # im2col reads x only through copies into its padded, phase or column buffers
        # (im2col.py), which gather from any strides: an image stem's NHWC -> NCHW
        # transpose then costs no copy of its own.
        return index == 0 and self.strategy is ConvStrategy.IM2COL

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        x, w, out = required(inputs, 0), required(inputs, 1), outputs[0]
        bias = inputs[2] if len(inputs) > 2 else None
        if self.taps is not None:
            rows, cols = self.taps
            live = np.ascontiguousarray(w[:, :, rows, cols])
            pages.release(w)  # the step reads the live taps' copy, never `w`
            w = live
        return self._path.bind(x, w, out, bias)


class _Path:
    """How one Conv2D layer runs with its strategy: the layouts its step takes and the
    step itself. The defaults are those of a strategy that needs NCHW on both sides."""

    in_last = ChannelsLast.REFUSED
    out_last = ChannelsLast.REFUSED
    # Its output keeps a channels-last input's layout (Kernel.channels_last_follows).
    follows = False
    # Its NCHW input is faster than a channels-last one (Kernel.leans_nchw).
    leans_nchw = False

    def __init__(self, conv: Conv2D) -> None:
        self.layer, self.win, self.group = conv.layer, conv.win, conv.group
        self.act: InPlace | None = conv.activation

    def bind(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        raise NotImplementedError


class Pointwise(_Path):
    """The 1x1 GEMM (pointwise.py). It reads and writes either layout: a channels-last
    tensor is the transposed (H*W, C) matrix (the weights are re-packed at bind for it,
    so they must be constant). Reading channels-last rows it writes channels-last rows
    too, faster than NCHW ones (the plain row-major product against a transposed one)."""

    def __init__(self, conv: Conv2D) -> None:
        super().__init__(conv)
        layer = self.layer
        if layer.const_weights:
            self.in_last = self.out_last = ChannelsLast.ACCEPTED
            self.follows = True
        # A widening 1x1 layer with a constant bias carries the bias through its GEMM
        # under a copy of NCHW input rows; from channels-last rows it needs an extra pass
        # over its output (worth avoiding when that output is large).
        out = conv.output_specs[0]
        self.leans_nchw = (
            layer.out_channels > layer.in_channels
            and layer.const_bias
            and out.size * out.dtype.itemsize >= _LEAN_NCHW_BYTES
        )

    def bind(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        bias_const, act = self.layer.const_bias, self.act
        if is_channels_last(x) or is_channels_last(out):
            # Its blocks of rows apply the activation between their products.
            return bind_pointwise_last(x, w, out, bias, bias_const, with_scratch(act, out))
        if (
            x.shape[0] == 1
            and x.shape[2] * x.shape[3] <= _HEAD_MAX_PLANE
            and w.size * w.itemsize >= _HEAD_MIN_WEIGHT_BYTES
            and self.layer.const_weights
        ):
            return bind_pointwise_head(x, w, out, bias, with_scratch(act, out, last=True))
        if bias_const and bias is not None and w.shape[0] > x.shape[1]:
            # Expanding 1x1 layers: copying the narrower input under a ones row is cheaper
            # than a bias pass over the wider output.
            main = bind_pointwise_with_bias(x, w, out, bias)
            return with_epilogue(main, out, None, act, False)
        return with_epilogue(bind_pointwise(x, w, out), out, bias, act, bias_const)


class Depthwise(_Path):
    """kh*kw vectorised multiply-adds over all channels (depthwise.py), channels-last
    whenever its input is stored so and the layer gains from it."""

    def __init__(self, conv: Conv2D) -> None:
        super().__init__(conv)
        x = conv.input(0)
        if uses_channels_last(self.win, x.shape, x.dtype.itemsize, stored_last=True):
            self.in_last = self.out_last = ChannelsLast.PREFERRED

    def bind(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        # The depthwise step adds the bias while compacting its result into `out`.
        return bind_depthwise(
            self.win,
            x,
            w,
            out,
            bias,
            w_const=self.layer.const_weights,
            bias_const=self.layer.const_bias,
            # Before the copy of its accumulator (a temporary) into `out`.
            act=with_scratch(self.act, out),
        )


class Winograd(_Path):
    """Winograd F(2x2, 3x3) or F(4x4, 3x3) (winograd.py). It gathers its input tiles and
    scatters its output tiles channels-last: NCHW on either side costs a transposing
    copy."""

    in_last = out_last = ChannelsLast.PREFERRED

    def __init__(self, conv: Conv2D) -> None:
        super().__init__(conv)
        self.transform = F4X4 if conv.strategy == ConvStrategy.WINOGRAD4 else F2X2

    def bind(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        main = bind_winograd(self.win, x, w, out, bias, self.transform)
        pages.release(w)  # the step reads the transformed weights, not these
        dense = out.transpose(0, 2, 3, 1) if is_channels_last(out) else out
        return with_epilogue(main, dense, None, self.act, False)


class Im2col(_Path):
    """Columns + GEMM (im2col.py), built channels-last for narrow outputs with many
    channels (rows of C elements rather than OW) and for small column matrices of
    channels-last inputs."""

    def __init__(self, conv: Conv2D) -> None:
        super().__init__(conv)
        layer = self.layer
        self.hwc = (
            layer.group == 1
            and layer.out[1] <= _HWC_MAX_OW
            and layer.in_channels >= _HWC_MIN_CH
            and layer.const_weights
        )
        # Plain im2col on one image writes either layout (its GEMM transposed, with the
        # weights re-packed at bind, so constant); the bias must be a constant or absent
        # (a run-time bias is added on NCHW rows).
        plain = (
            not self.hwc
            and layer.group == 1
            and layer.batch == 1
            and layer.const_weights
            and (layer.const_bias or not layer.has_bias)
        )
        self.out_last = ChannelsLast.ACCEPTED if plain else ChannelsLast.REFUSED
        # Such a layer with a column matrix small enough to build whole builds it
        # channels-last from an input stored so (no transposing copy), and its GEMM
        # then writes channels-last rows as they come.
        x = conv.input(0)
        self.follows = plain and _im2col_bytes(self.win, layer.in_channels, x.dtype) <= (
            _HWC_LAST_BYTES
        )
        if self.hwc:
            self.in_last = ChannelsLast.PREFERRED
        elif self.follows:
            self.in_last = ChannelsLast.ACCEPTED

    def bind(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
    ) -> Compute:
        bias_const, act = self.layer.const_bias, self.act
        if bias_const and self.group == 1 and self.layer.const_weights:
            # The bias rides in the GEMM: a column of ones under the im2col matrix, the
            # weights packed with it once (so only while they are constant too).
            main = self._columns(x, w, out, bias)
            dense = out.transpose(0, 2, 3, 1) if is_channels_last(out) else out
            return with_epilogue(main, dense, None, act, False)
        if (
            bias is not None
            and not self.hwc
            and in_image_blocks(self.win, self.group, x.shape, x.itemsize)
            and out.flags.c_contiguous
        ):
            # A run-time bias over a batch also rides in the GEMM (the weights are packed
            # with it on every call), not in a broadcast pass over the output.
            main = bind_im2col(self.win, 1, x, w, out, bias, bias_runtime=True)
            return with_epilogue(main, out, None, act, False)
        main = self._columns(x, w, out)
        if bias is None and is_channels_last(out):
            return with_epilogue(main, out.transpose(0, 2, 3, 1), None, act, False)
        return with_epilogue(main, out, bias, act, bias_const)

    def _columns(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None
    ) -> Compute:
        if self.hwc or (self.follows and is_channels_last(x)):
            return bind_im2col_hwc(self.win, x, w, out, bias)
        return bind_im2col(self.win, self.group, x, w, out, bias)


def _trimmed(
    win: Window, in_hw: tuple[int, int], weights: np.ndarray
) -> tuple[Window, tuple[slice, slice]] | None:
    """The window without its dead taps (those reading only padding, dead_taps.py) and
    the weight slices of the live ones, or None when no tap is dead. Only for constant
    weights (trainable ones are run-time variables: another input size would read the
    taps cut) that are all finite (a cut tap's 0 * inf would have been NaN)."""
    kept = trim_window(in_hw, win.kernel, win.strides, win.dilations, win.pads)
    if kept is None or not np.isfinite(weights).all():
        return None
    (rows, cols), pads = kept
    trimmed = replace(
        win,
        kernel=(len(rows), len(cols)),
        pads=(pads[0], pads[1], pads[2], pads[3]),
    )
    return trimmed, (slice(rows.start, rows.stop), slice(cols.start, cols.stop))


# Each strategy's class.
_PATHS: dict[ConvStrategy, type[_Path]] = {
    ConvStrategy.POINTWISE: Pointwise,
    ConvStrategy.DEPTHWISE: Depthwise,
    ConvStrategy.WINOGRAD4: Winograd,
    ConvStrategy.WINOGRAD: Winograd,
    ConvStrategy.IM2COL: Im2col,
}

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
# multiply transposed (see pointwise.bind_pointwise_head).
_HEAD_MAX_PLANE = 16
_HEAD_MIN_WEIGHT_BYTES = 512 << 10

# Smallest output (bytes) of a widening 1x1 layer with a constant bias that leans NCHW
# (see Conv2D.leans_nchw).
_LEAN_NCHW_BYTES = 128 << 10
