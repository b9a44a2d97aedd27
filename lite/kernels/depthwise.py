"""Depthwise 2-D convolution (group == in_channels == out_channels) on NCHW tensors.

Conv2D delegates here when every channel has its own filter: a depthwise layer does too
little work per element for a GEMM. Two algorithms, chosen at bind from the shapes:

- channels-last (most layers): the input is copied once, transposed, into a zero-padded
  (N, H, W, C) buffer. There a kernel tap at column offset j is a shift by j*C elements,
  so every tap's window is one strided view of the buffer, and all kh*kw taps run as a
  single `einsum` call: a fused multiply-accumulate over taps along rows of OW*C
  contiguous elements, with no temporaries. A column stride > 1 first spreads the input
  into kw column-tap planes (plane j holds columns ow*sw + j*dw), or, for wide kernels,
  into sw column phases (phase u holds columns u, u + sw, ...: one copy of the input,
  taps past the kernel weighted zero), so the rows stay contiguous; with many channels
  a column-strided layer on a channels-last input skips the copy and reads the input
  in place, C contiguous elements at a time (_bind_direct). The bias is added
  on the channels-last result, and one transposing copy writes NCHW `out`. When the
  planner stores the input or `out` channels-last (see Kernel.channels_last_input), the
  first copy runs in contiguous rows and the last one disappears: the einsum writes
  `out` itself. On MobileNetV2's depthwise layers this beats the planar multiply-adds
  (benchmarks/lite_inference.py times the network).
- planar: kh*kw multiply-adds over the stride phases of the padded input, for inputs
  with so few channels that channels-last rows would be too short, and for large
  column-strided inputs, whose transposing copy costs more than the phase copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels.activation import InPlace, then_activation
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.spatial import Window
from sporenet.lite.kernels.workspace import temporary

# Planar layout choice: phase grids of at most this many positions use the interleaved
# layout. Constant weights are expanded to one value per element (up to _EXPAND_LIMIT
# bytes): a multiply broadcasting one weight per channel row is much slower than a
# contiguous one, even on long rows.
_SMALL_PLANE = 400
_EXPAND_LIMIT = 4 << 20


# The fused multiply-accumulate over taps: NumPy's C einsum without the Python wrapper
# (whose overhead matches the work on small planes). NumPy builds without this private
# path get np.einsum.
_c_einsum = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "c_einsum", None)
_einsum: Callable[..., Any] = _c_einsum if callable(_c_einsum) else np.einsum

# Fewest channels for the channels-last algorithm: below it the transposing copies run in
# rows of C elements and the planar multiply-adds are cheaper.
_MIN_CHANNELS_LAST = 8
# Column-strided layers whose planar phase grid has at least this many positions stay
# planar: their input (sw*sh times the output) costs more to transpose than the planar
# phase copies plus multiply-adds cost.
_STRIDED_PLANAR_GRID = 400


def bind_depthwise(
    win: Window,
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    *,
    w_const: bool,
    bias_const: bool,
    act: InPlace | None = None,
) -> Compute:
    """The depthwise step writing `out`, bias and the in-place activation `act`
    included; see the module docstring."""
    if bias is not None and bias_const and not bias.any():
        bias = None  # a zero bias (BlazeFace's folded ones) would cost a pass for nothing
    if win.kernel == (1, 1) and win.strides == (1, 1) and not any(win.pads):
        if w_const and (bias is None or bias_const) and _both_last(x, out):
            step = _bind_scale_rows(x, w, out, bias)
        else:
            step = _bind_scale(x, w, out, bias)
        return then_activation(step, out, act)
    stored_last = not x.flags.c_contiguous and x.transpose(0, 2, 3, 1).flags.c_contiguous
    if uses_channels_last(win, x.shape, x.itemsize, stored_last=stored_last):
        if stored_last and reads_in_place(win, x.shape):
            return _bind_direct(
                win, x, w, out, bias, w_const=w_const, bias_const=bias_const, act=act
            )
        return _bind_channels_last(
            win, x, w, out, bias, w_const=w_const, bias_const=bias_const, act=act
        )
    step = _bind_planar(win, x, w, out, bias, w_const=w_const, bias_const=bias_const)
    return then_activation(step, out, act)


def _bind_scale(x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None) -> Compute:
    """A 1x1 unpadded stride-1 depthwise layer is a per-channel scale and shift: two
    broadcast ufuncs over x in whatever layout it is stored, no padded copy."""
    c = x.shape[1]
    scale = w.reshape(c, 1, 1)  # a view: a weight computed at run time is read as it is
    shift = bias.reshape(c, 1, 1) if bias is not None else None
    multiply, add = np.multiply, np.add
    if shift is None:
        return lambda: multiply(x, scale, out=out)

    def scale_shift() -> None:
        multiply(x, scale, out=out)
        add(out, shift, out=out)

    return scale_shift


def _both_last(x: np.ndarray, out: np.ndarray) -> bool:
    """Whether both arrays are NCHW views of channels-last memory."""
    return all(a.transpose(0, 2, 3, 1).flags.c_contiguous for a in (x, out))


def _bind_scale_rows(
    x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
) -> Compute:
    """The per-channel scale and shift on channels-last storage, over rows of W*C
    elements with the constant weights (and bias) tiled to one row: broadcasting a
    (C, 1, 1) operand there would loop over runs of C elements."""
    n, c, h, wd = x.shape
    rows = x.transpose(0, 2, 3, 1).reshape(n * h, wd * c)
    target = out.transpose(0, 2, 3, 1).reshape(n * h, wd * c)
    scale = np.tile(w.reshape(c), wd)
    pages.release(w)  # only the tiled copy is read
    multiply, add = np.multiply, np.add
    if bias is None:
        return lambda: multiply(rows, scale, out=target)
    shift = np.tile(bias, wd)

    def scale_shift() -> None:
        multiply(rows, scale, out=target)
        add(target, shift, out=target)

    return scale_shift


def uses_channels_last(
    win: Window, x_shape: tuple[int, ...], itemsize: int, *, stored_last: bool = False
) -> bool:
    """Whether the channels-last algorithm runs for this input (else the planar one).

    A large column-strided input stored NCHW stays planar (its transposing copy costs
    more than the phase copies); stored channels-last (`stored_last`, see
    Kernel.channels_last_input) it has no transposing copy to pay."""
    tiled_w = win.kernel[0] * win.kernel[1] * win.out[1] * x_shape[1] * itemsize
    return (
        x_shape[1] >= _MIN_CHANNELS_LAST
        and tiled_w <= _EXPAND_LIMIT
        and (
            stored_last
            or win.strides[1] == 1
            or _phase_grid(win, x_shape[2:]) < _STRIDED_PLANAR_GRID
        )
    )


def _phase_grid(win: Window, hw: tuple[int, ...]) -> int:
    """Positions in one stride phase of the padded input (the planar layout's grid)."""
    (h, wd), (sh, sw) = hw, win.strides
    hq = -(-max(h + win.pads[0] + win.pads[2], win.extent[0]) // sh)
    wq = -(-max(wd + win.pads[1] + win.pads[3], win.extent[1]) // sw)
    return hq * wq


def channels_last_shape(win: Window, x_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the padded (or column-tap) buffer of the channels-last algorithm.

    Column stride 1: padded (N, Hp, Wp, C); tap (i, j) of output row r starts at row
    r*sh + i*dh, column j*dw, and its OW*C elements are contiguous. Column stride > 1:
    column-tap planes (N, Hp, kw, OW, C), plane j holding padded columns ow*sw + j*dw,
    so tap (i, j) reads plane j at row r*sh + i*dh, again OW*C contiguous elements.
    """
    n, c, h, wd = x_shape
    hp = max(h + win.pads[0] + win.pads[2], win.extent[0])
    if win.strides[1] == 1:
        return (n, hp, max(wd + win.pads[1] + win.pads[3], win.extent[1]), c)
    return (n, hp, win.kernel[1], win.out[1], c)


def channels_last_copies(
    win: Window, buf: np.ndarray, x: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(destination, source) pairs that copy NCHW `x` into the channels-last `buf`."""
    h, wd = x.shape[2:]
    kw, sw, dw, ow = win.kernel[1], win.strides[1], win.dilations[1], win.out[1]
    top, left = win.pads[0], win.pads[1]
    xt = x.transpose(0, 2, 3, 1)
    if sw == 1:
        return [(buf[:, top : top + h, left : left + wd, :], xt)]
    copies = []
    for j in range(kw):
        q0 = max(0, -(-(left - j * dw) // sw))
        q1 = min(ow, -(-(left + wd - j * dw) // sw))
        if q1 > q0:
            start = q0 * sw + j * dw - left
            copies.append(
                (
                    buf[:, top : top + h, j, q0:q1, :],
                    xt[:, :, start : start + (q1 - q0 - 1) * sw + 1 : sw, :],
                )
            )
    return copies


def channels_last_views(win: Window, buf: np.ndarray) -> np.ndarray:
    """Read-only (kh, kw, N, OH, OW*C) strided views: every tap's input rows in `buf`."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    n, c = buf.shape[0], buf.shape[-1]
    if sw == 1:
        sn, sr, sc, se = buf.strides
        tap_strides = (sr * dh, sc * dw)
    else:
        sn, sr, sj, _, se = buf.strides
        tap_strides = (sr * dh, sj)
    return np.lib.stride_tricks.as_strided(
        buf, shape=(kh, kw, n, oh, ow * c), strides=(*tap_strides, sn, sr * sh, se), writeable=False
    )


def _bind_channels_last(
    win: Window,
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    *,
    w_const: bool,
    bias_const: bool,
    act: InPlace | None = None,
) -> Compute:
    """All taps as one einsum over strided views of a channels-last padded buffer (per
    band of output rows, see _bands)."""
    n, c = x.shape[:2]
    oh, ow = win.out
    block = _weight_block(win, c, x.itemsize)
    taps_w = w[:, 0].transpose(1, 2, 0)[:, :, None, :]
    if w_const:
        taps_w = taps_w.copy()  # (kh, kw, 1, C) contiguous: the tile's source
        pages.release(w)  # only the compact copy is read: the planner may drop `w`
    phases = uses_column_phases(win, x.shape)
    wt, tile_steps = _weight_tile(win, taps_w, block, phases)
    acc_nhwc, result = _accumulator(out, (n, oh, ow, c))
    acc = acc_nhwc.reshape(n, oh, ow * c)
    add_bias = _bias_step(bias, acc_nhwc)
    bands = (_phase_bands if phases else _bands)(win, x, wt, acc, block)
    # Bias, then the activation (elementwise: it runs on the contiguous accumulator,
    # before the copy into an NCHW `out` when there is one).
    epilogue = [] if add_bias is None else [add_bias]
    if act is not None:
        epilogue.append(partial(act, acc_nhwc))
    copyto, einsum = np.copyto, _einsum
    taps = "ijnpbq,ijq->npbq" if wt.ndim == 3 else "iujnpbq,iujq->npbq"

    def compute() -> None:
        for step in tile_steps:
            step()
        for refill, copies, parts, zeros in bands:
            refill()
            for dst, src in copies:
                copyto(dst, src)
            for v, k, a in parts:
                einsum(taps, v, k, out=a)
            for a in zeros:
                a.fill(0)
        for finish in epilogue:
            finish()
        if result is not None:
            copyto(out, result)

    return compute


# Fewest channels for which a column-strided layer reads its channels-last input in
# place (_bind_direct): the einsum's inner loop then runs over C contiguous elements.
_DIRECT_MIN_CHANNELS = 128


def reads_in_place(win: Window, x_shape: tuple[int, ...]) -> bool:
    """Whether a column-strided layer on a channels-last input reads it in place
    (_bind_direct) rather than through a padded copy."""
    return win.strides[1] > 1 and x_shape[1] >= _DIRECT_MIN_CHANNELS


def _bind_direct(
    win: Window,
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    *,
    w_const: bool,
    bias_const: bool,
    act: InPlace | None = None,
) -> Compute:
    """A column-strided layer straight from its channels-last input, with no copy.

    With a column stride the taps' windows are not contiguous rows in any layout the
    input can be copied into once, so copying buys only a longer inner loop; with many
    channels the runs of C elements are long enough. The output is cut into blocks
    whose pixels read the same kernel rows and columns inside the input (one block for
    the interior, thin ones along the padded edges), and each block is one einsum over
    strided views of x for those taps: padding is never read, so nothing is copied or
    zeroed."""
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    top, left = win.pads[0], win.pads[1]
    taps_w = w[:, 0].transpose(1, 2, 0)  # (kh, kw, C)
    if w_const:
        taps_w = taps_w.copy()
        pages.release(w)
    acc_nhwc, result = _accumulator(out, (n, oh, ow, c))
    xt = x.transpose(0, 2, 3, 1)
    sn, sr, sc, se = xt.strides
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    zeros: list[np.ndarray] = []
    for r0, r1, i0, i1 in _tap_runs(oh, sh, dh, kh, top, h):
        for q0, q1, j0, j1 in _tap_runs(ow, sw, dw, kw, left, wd):
            target = acc_nhwc[:, r0:r1, q0:q1]
            if i1 == i0 or j1 == j0:
                zeros.append(target)
                continue
            first = xt[:, r0 * sh + i0 * dh - top, q0 * sw + j0 * dw - left]  # (N, C)
            views = np.lib.stride_tricks.as_strided(
                first,
                shape=(i1 - i0, j1 - j0, n, r1 - r0, q1 - q0, c),
                strides=(dh * sr, dw * sc, sn, sh * sr, sw * sc, se),
                writeable=False,
            )
            blocks.append((views, taps_w[i0:i1, j0:j1], target))
    add_bias = _bias_step(bias, acc_nhwc)
    epilogue: list[Compute] = [partial(z.fill, 0) for z in zeros]
    epilogue += [] if add_bias is None else [add_bias]
    if act is not None:
        epilogue.append(partial(act, acc_nhwc))
    copyto, einsum = np.copyto, _einsum

    def compute() -> None:
        for v, k, a in blocks:
            einsum("ijnrqc,ijc->nrqc", v, k, out=a)
        for finish in epilogue:
            finish()
        if result is not None:
            copyto(out, result)

    return compute


def _tap_runs(
    size: int, stride: int, dilation: int, kernel: int, pad: int, extent: int
) -> list[tuple[int, int, int, int]]:
    """Along one axis: runs [o0, o1) of output positions whose kernel taps [k0, k1)
    are the ones that fall inside the input (0 <= o*stride + k*dilation - pad < extent)."""
    runs: list[list[int]] = []
    for o in range(size):
        lo = min(kernel, max(0, -(-(pad - o * stride) // dilation)))
        hi = max(lo, min(kernel, -(-(pad + extent - o * stride) // dilation)))
        if runs and runs[-1][2:] == [lo, hi]:
            runs[-1][1] = o + 1
        else:
            runs.append([o, o + 1, lo, hi])
    return [(a, b, lo, hi) for a, b, lo, hi in runs]


def _weight_tile(
    win: Window, taps_w: np.ndarray, block: int, phases: bool
) -> tuple[np.ndarray, list[Compute]]:
    """The weights tiled along `block` output columns, indexed like the tap views'
    leading axes, and the steps that rewrite them each call.

    Weights tiled along `block` output columns: wt[i, j, b*C + c] = w[c, 0, i, j]; the
    einsum runs over rows of OW*C elements seen as OW/block runs of block*C. The tile
    is a temporary rewritten every call: kept, it would hold `block` copies of the
    weights per layer (most of a MobileNet's depthwise memory), and rewriting a few
    kilobytes that stay in cache for the einsum costs little next to it. With column
    phases (see _phase_bands) the tile is (kh, sw, kq, block*C): tap j is phase j % sw,
    offset j // sw, and the slots past the kernel's last column hold zeros."""
    (kh, kw), sw = win.kernel, win.strides[1]
    c, dtype = taps_w.shape[-1], taps_w.dtype
    copyto = np.copyto
    if not phases:
        tile = temporary((kh, kw, block, c), dtype)
        return tile.reshape(kh, kw, block * c), [partial(copyto, tile, taps_w)]
    kq = -(-kw // sw)
    tile = temporary((kh, sw, kq, block, c), dtype)
    steps: list[Compute] = []
    for u in range(sw):
        used = len(range(u, kw, sw))
        steps.append(partial(copyto, tile[:, u, :used], taps_w[:, u::sw]))
        if used < kq:
            steps.append(partial(tile[:, u, used:].fill, 0))
    return tile.reshape(kh, sw, kq, block * c), steps


# A copied element costs about as much as two of the einsum's multiply-adds, and column
# phases make about this many more calls than column-tap planes (see uses_column_phases).
_COPY_COST = 2
_PHASE_CALLS = 4


def uses_column_phases(win: Window, x_shape: tuple[int, ...]) -> bool:
    """Whether a column-strided layer fills column phases (_phase_bands) rather than
    column-tap planes (_bands), by their cost in copied elements and multiply-adds.

    kw column-tap planes copy kw*OW columns of every input row and run kh*kw taps;
    sw column phases copy each input column once, and run kh*sw*ceil(kw/sw) taps,
    the ones past the kernel with zero weights. Phases win on wide kernels (a 5x5
    kernel of stride 2 copies its input once instead of 2.5 times), when the saving
    pays for their extra calls; a dilated kernel's taps do not fall on whole phase
    columns, so it keeps the planes."""
    (kh, kw), (_, sw), (_, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    if sw == 1 or dw != 1:
        return False
    n, c, h = x_shape[:3]
    kq = -(-kw // sw)
    planes = _COPY_COST * kw * ow * h + kh * kw * oh * ow
    phases = _COPY_COST * sw * (ow + kq - 1) * h + kh * sw * kq * oh * ow
    return (planes - phases) * n * c > _PHASE_CALLS * _CALL_WORTH


# A band's work: the step rewriting its buffer's zeros, the copies of the input into it,
# the einsums (views, tiled weights, accumulator rows) and the accumulator rows it zeroes.
_Band = tuple[
    Compute,
    list[tuple[np.ndarray, np.ndarray]],
    list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    list[np.ndarray],
]

# Bytes of column-tap planes a column-strided layer fills at once: larger planes are
# filled and read one band of output rows after another, so the plan's widest cut holds
# one band, not 1.5 to 2.5 times the input.
_BAND_BYTES = 256 << 10


def _bands(win: Window, x: np.ndarray, wt: np.ndarray, acc: np.ndarray, block: int) -> list[_Band]:
    """The layer's work in bands of output rows: one band for a column stride of 1 (the
    padded buffer is the input's size); column-tap planes of up to _BAND_BYTES each."""
    n, c, h, wd = x.shape
    (kh, _), (sh, sw), (dh, _), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    acc_blocks = acc.reshape(n, oh, ow // block, block * c)
    if sw == 1:
        buf, refill = _padded_buffer(win, x, n * ow * c)
        views = _tap_views(channels_last_views(win, buf), block, c)
        # Runs of output rows and the kernel rows they read inside the input (see
        # _row_segments); rows whose taps all fall in the padding start at zero.
        segments = _row_segments(win, h, n * ow * c)
        parts = [
            (views[i0:i1, :, :, r0:r1], wt[i0:i1], acc_blocks[:, r0:r1])
            for r0, r1, i0, i1 in segments
            if i1 > i0
        ]
        zeros = [acc[:, r0:r1] for r0, r1, i0, i1 in segments if i1 == i0]
        return [(refill, channels_last_copies(win, buf, x), parts, zeros)]
    row_bytes = n * sh * win.kernel[1] * ow * c * x.itemsize
    rows = min(oh, max(1, _BAND_BYTES // row_bytes))
    span = (rows - 1) * sh + (kh - 1) * dh + 1  # padded input rows a band reads
    buf = temporary((n, span, win.kernel[1], ow, c), x.dtype)
    bands: list[_Band] = []
    top = win.pads[0]
    for r0 in range(0, oh, rows):
        r1 = min(oh, r0 + rows)
        p0, p1 = r0 * sh, (r1 - 1) * sh + (kh - 1) * dh + 1  # its padded rows
        i0, i1 = max(p0, top), max(max(p0, top), min(p1, top + h))  # of them, the input's
        # The band as a layer of its own: its input rows, padded above by i0 - p0 rows.
        band = Window(
            win.kernel, win.strides, win.dilations, (i0 - p0, *win.pads[1:]), (r1 - r0, ow)
        )
        part = x[:, :, i0 - top : i1 - top]
        views = _tap_views(channels_last_views(band, buf), block, c)
        bands.append(
            (
                _tap_plane_fill(band, buf, i1 - i0, wd),
                channels_last_copies(band, buf, part),
                [(views, wt, acc_blocks[:, r0:r1])],
                [],
            )
        )
    return bands


def _phase_bands(
    win: Window, x: np.ndarray, wt: np.ndarray, acc: np.ndarray, block: int
) -> list[_Band]:
    """The work of a column-strided layer over column phases, in bands of output rows
    (of up to _BAND_BYTES of buffer each, as _bands does).

    The band's padded rows are copied into an (N, rows, sw, Wq, C) buffer, phase u of a
    row holding its padded columns u, u + sw, u + 2*sw, ...: kernel tap (i, j) of output
    row r then reads row r*sh + i*dh, phase j % sw, from column j // sw on, OW*C
    contiguous elements, and the input is copied once (column-tap planes copy it about
    kw/sw times). Everything the copies leave is zeroed: the zero-weight taps past the
    kernel read it too."""
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (dh, _), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    top, left = win.pads[0], win.pads[1]
    kq = -(-kw // sw)
    wq = ow + kq - 1  # phase columns the taps read
    acc_blocks = acc.reshape(n, oh, ow // block, block * c)
    rows = min(oh, max(1, _BAND_BYTES // (n * sh * sw * wq * c * x.itemsize)))
    buf = temporary((n, (rows - 1) * sh + (kh - 1) * dh + 1, sw, wq, c), x.dtype)
    sn, sr, su, sq, se = buf.strides
    xt = x.transpose(0, 2, 3, 1)
    bands: list[_Band] = []
    for r0 in range(0, oh, rows):
        r1 = min(oh, r0 + rows)
        p0, p1 = r0 * sh, (r1 - 1) * sh + (kh - 1) * dh + 1  # its padded rows
        i0 = min(max(p0, top), p1)
        i1 = max(i0, min(p1, top + h))  # of them, the input's
        zeros, copies = [buf[:, : i0 - p0], buf[:, i1 - p0 : p1 - p0]], []
        for u in range(sw):
            q0 = min(wq, max(0, -(-(left - u) // sw)))  # phase columns inside the input
            q1 = max(q0, min(wq, -(-(left + wd - u) // sw)))
            inside = buf[:, i0 - p0 : i1 - p0, u]
            zeros += [inside[:, :, :q0], inside[:, :, q1:]]
            if q1 > q0 and i1 > i0:
                start = q0 * sw + u - left
                src = xt[:, i0 - top : i1 - top, start : start + (q1 - q0 - 1) * sw + 1 : sw]
                copies.append((inside[:, :, q0:q1], src))
        views = np.lib.stride_tricks.as_strided(
            buf,
            shape=(kh, sw, kq, n, r1 - r0, ow // block, block * c),
            strides=(sr * dh, su, sq, sn, sr * sh, block * c * se, se),
            writeable=False,
        )
        fills = [partial(v.fill, 0) for v in zeros if v.size]
        bands.append((_run_all(fills), copies, [(views, wt, acc_blocks[:, r0:r1])], []))
    return bands


def _run_all(steps: Sequence[Compute]) -> Compute:
    """One step running `steps` in order."""

    def run() -> None:
        for step in steps:
            step()

    return run


def _tap_views(rows: np.ndarray, block: int, c: int) -> np.ndarray:
    """The (kh, kw, N, OH, OW*C) tap views as (kh, kw, N, OH, OW/block, block*C)."""
    kh, kw, n, oh, q = rows.shape
    return np.lib.stride_tricks.as_strided(
        rows,
        shape=(kh, kw, n, oh, q // (block * c), block * c),
        strides=(*rows.strides[:-1], block * c * rows.strides[-1], rows.strides[-1]),
        writeable=False,
    )


def _padded_buffer(win: Window, x: np.ndarray, row_size: int) -> tuple[np.ndarray, Compute]:
    """The padded (N, Hp, Wp, C) buffer of a column stride of 1, from the plan's arena,
    and the step that rewrites its zeros (other steps use the same memory between
    calls)."""
    buf = temporary(channels_last_shape(win, x.shape), x.dtype)
    h, wd = x.shape[2:]
    top, left = win.pads[0], win.pads[1]
    # Runs of output rows that skip the kernel rows over padding never read the margin
    # rows above and below the input (see _row_segments).
    every_row = _row_segments(win, h, row_size) == [(0, win.out[0], 0, win.kernel[0])]
    return buf, _frame_fill(buf, (top, top + h), (left, left + wd), margin_rows=every_row)


def _tap_plane_fill(win: Window, buf: np.ndarray, h: int, wd: int) -> Compute:
    """The step that zeroes what the copies leave of column-tap planes (N, Hp, kw, OW, C):
    the rows above and below the input in every plane, and in plane j the output columns
    whose input column ow*sw + j*dw falls in the left or right padding."""
    top, left = win.pads[0], win.pads[1]
    kw, sw, dw, ow = win.kernel[1], win.strides[1], win.dilations[1], win.out[1]
    views = [buf[:, :top], buf[:, top + h :]]
    for j in range(kw):
        q0 = min(ow, max(0, -(-(left - j * dw) // sw)))
        q1 = max(q0, min(ow, -(-(left + wd - j * dw) // sw)))
        views += [buf[:, top : top + h, j, :q0], buf[:, top : top + h, j, q1:]]
    views = [v for v in views if v.size]

    def fill() -> None:
        for v in views:
            v.fill(0)

    return fill


def _accumulator(out: np.ndarray, nhwc: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """Where the einsum accumulates, as (N, OH, OW, C), and the NCHW view of it that is
    copied into `out` after (None when `out` is stored channels-last, see
    Kernel.channels_last_output: the einsum then writes `out` itself)."""
    out_nhwc = out.transpose(0, 2, 3, 1)
    if out_nhwc.flags.c_contiguous:
        return out_nhwc, None
    acc_nhwc = temporary(nhwc, out.dtype)
    return acc_nhwc, acc_nhwc.transpose(0, 3, 1, 2)


def _bias_step(bias: np.ndarray | None, acc_nhwc: np.ndarray) -> Compute | None:
    """The step adding the bias to the channels-last (N, OH, OW, C) accumulator: the
    bias tiled over the most pixels (a divisor of OH*OW) within _BIAS_TILE_BYTES, into
    a temporary rewritten every call (like the weights' tile, so it reads the bias's
    current values, constant or not), and added in runs of that many pixels. Runs of
    a few thousand elements: a broadcast over the pixels' runs of C elements, or over
    the weights' shorter tile, loops over short rows and runs up to 1.5 times slower."""
    if bias is None:
        return None
    n, oh, ow, c = acc_nhwc.shape
    most = max(1, _BIAS_TILE_BYTES // (c * acc_nhwc.itemsize))
    pixels = max(d for d in range(1, min(oh * ow, most) + 1) if (oh * ow) % d == 0)
    if pixels < ow and pixels * c < _MIN_BIAS_RUN:
        pixels = ow  # few divisors (a prime OW): whole output rows
    runs = acc_nhwc.reshape(n, oh * ow // pixels, pixels * c)
    tile = temporary((pixels, c), acc_nhwc.dtype)
    row, copyto, add = tile.reshape(pixels * c), np.copyto, np.add

    def add_tiled() -> None:
        copyto(tile, bias)
        add(runs, row, out=runs)

    return add_tiled


# Largest tile (bytes) of the bias added to a channels-last accumulator (see _bias_step):
# long enough for contiguous runs, small enough to stay in the L1 cache.
_BIAS_TILE_BYTES = 32 << 10
_MIN_BIAS_RUN = 512


def _frame_fill(
    buf: np.ndarray, rows: tuple[int, int], cols: tuple[int, int], *, margin_rows: bool = True
) -> Compute:
    """The step that zeroes the frame of a padded (N, Hp, Wp, C) buffer around the
    interior rows [r0, r1) and columns [c0, c1), in as few calls as the layout allows;
    margin_rows=False leaves the rows above and below the interior as they are (for
    steps that never read them).

    In row-major memory the right margin of a row and the left margin of the next one
    are adjacent, so all side margins form one strided run per row; with as many rows of
    margin below as above, the top and bottom margins form one view too. A thin frame
    costs little to write, but on small layers four calls are a visible share."""
    n, hp, wp, c = buf.shape
    (r0, r1), (c0, c1) = rows, cols
    side = (wp - c1 + c0) * c  # right margin of one row + left margin of the next
    sn, sr, _, se = buf.strides
    flat = buf.reshape(-1)
    views = []
    if r0 > 0 and r1 < hp and side and buf.flags.c_contiguous:
        start = (r0 - 1) * wp * c + c1 * c  # right margin of the row above the interior
        views.append(
            np.lib.stride_tricks.as_strided(
                flat[start:], shape=(n, r1 - r0 + 1, side), strides=(sn, sr, se)
            )
        )
        if r0 == hp - r1:
            views.append(
                np.lib.stride_tricks.as_strided(
                    buf, shape=(n, 2, r0 * wp * c), strides=(sn, r1 * sr, se)
                )
            )
        else:
            views += [buf[:, :r0], buf[:, r1:]]
        if not margin_rows:
            views = views[:1]
    else:
        views = [buf[:, r0:r1, :c0], buf[:, r0:r1, c1:]]
        if margin_rows:
            views += [buf[:, :r0], buf[:, r1:]]
    views = [v for v in views if v.size]

    def fill() -> None:
        for v in views:
            v.fill(0)

    return fill


def _weight_block(win: Window, c: int, itemsize: int) -> int:
    """Output columns the tiled weights span: the whole row unless that tile would be too
    large to stay in cache between calls, then the fewest columns (a divisor of OW) whose
    runs of block*C elements are long enough for the einsum's inner loop."""
    (kh, kw), ow = win.kernel, win.out[1]
    if kh * kw * ow * c * itemsize <= _TILED_WEIGHTS_LIMIT:
        return ow
    for block in range(1, ow + 1):
        if ow % block == 0 and block * c >= _MIN_BLOCK_RUN:
            return block
    return ow


# Largest tiled weights (bytes) kept whole along the output row, and the shortest run of
# elements a narrower tile gives the einsum (see _weight_block).
_TILED_WEIGHTS_LIMIT = 64 << 10
_MIN_BLOCK_RUN = 1024


def _row_segments(win: Window, h: int, row_size: int) -> list[tuple[int, int, int, int]]:
    """(first, end) output rows and (first, end) kernel rows they read inside the input.

    A kernel row that reads only padding rows adds zeros: on short inputs (a text line
    2 rows high under a 5x5 kernel) that is most of the work, so runs of output rows that
    read the same kernel rows get one einsum each. When skipping saves little, one run
    covers everything (one call is cheaper than several): a small share of the work, or
    fewer multiply-adds (`row_size` per output row and tap) than the extra calls cost."""
    (kh, _), (sh, _), (dh, _), (oh, _) = win.kernel, win.strides, win.dilations, win.out
    top = win.pads[0]
    runs: list[list[int]] = []
    for r in range(oh):
        lo = max(0, -(-(top - r * sh) // dh))
        hi = max(lo, min(kh, -(-(top + h - r * sh) // dh)))
        if runs and runs[-1][2:] == [lo, hi]:
            runs[-1][1] = r + 1
        else:
            runs.append([r, r + 1, lo, hi])
    skipped = sum((r1 - r0) * (kh - (i1 - i0)) for r0, r1, i0, i1 in runs)
    saved = skipped * win.kernel[1] * row_size
    if skipped < _MIN_SKIPPED_SHARE * oh * kh or saved < _CALL_WORTH * (len(runs) - 1):
        return [(0, oh, 0, kh)]
    return [(r0, r1, i0, i1) for r0, r1, i0, i1 in runs]


# Smallest share of (output row, kernel row) pairs in the padding that is worth one
# einsum call per run of rows (see _row_segments).
_MIN_SKIPPED_SHARE = 0.15
# Multiply-adds an einsum does in about the time one more call costs.
_CALL_WORTH = 12000


def _bind_planar(
    win: Window,
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    *,
    w_const: bool,
    bias_const: bool,
) -> Compute:
    """kh*kw multiply-adds, each one long contiguous NumPy call.

    The padded input is split into stride phases: phase (a, b) holds padded rows
    a, a+sh, ... and columns b, b+sw, ... (stride 1 has one phase, the padded input).
    Inside a phase every kernel tap reads a window at a fixed (row, column) offset, so
    each tap is a product of whole arrays; NumPy's cost then is the element count,
    not a Python or inner-loop call per row. Two layouts of the phases:

    - planar (N, C, rows, cols) flattened: a tap is one 1-D slice over all channels;
      the result is on the wider phase grid, and a final strided copy drops the
      columns and rows past the output. Best for large planes.
    - interleaved (N, rows, cols, C): a tap is (N, OH, OW*C) with contiguous rows and
      no wasted grid positions. Best for small planes with many channels, where the
      planar grid's padding would be a large share of the work.

    Constant weights are expanded at bind to the layout (one value per element of a
    row), so no call broadcasts over short rows.
    """
    grid = _PhaseGrid(win, x)
    phases, refill = grid.phases(x)
    views, weights, acc, result = grid.operands(phases, w, w_const)
    if w_const:
        pages.release_unless_read(w, *weights)  # expanded copies, unless views of `w`
    finish = _planar_finish(out, result, bias, bias_const)
    tmp = temporary(acc.shape, acc.dtype)
    (v0, w0), rest = (views[0], weights[0]), list(zip(views[1:], weights[1:], strict=True))
    multiply, add = np.multiply, np.add

    def compute() -> None:
        for fill in refill:
            fill()
        multiply(v0, w0, out=acc)
        for v, wt in rest:
            multiply(v, wt, out=tmp)
            add(acc, tmp, out=acc)
        finish()

    return compute


class _PhaseGrid:
    """The stride phases of a padded input (see _bind_planar): their grid, the phase
    and offset of every kernel tap, and which layout the phases take."""

    def __init__(self, win: Window, x: np.ndarray) -> None:
        self.win = win
        n, c, h, wd = x.shape
        (kh, kw), (sh, sw), (dh, dw) = win.kernel, win.strides, win.dilations
        self.hq = -(-max(h + win.pads[0] + win.pads[2], win.extent[0]) // sh)
        self.wq = -(-max(wd + win.pads[1] + win.pads[3], win.extent[1]) // sw)
        # Per tap: its phase and its (row, column) offset inside the phase.
        self.taps = [
            (((i * dh) % sh, (j * dw) % sw), i * dh // sh, j * dw // sw)
            for i in range(kh)
            for j in range(kw)
        ]
        self.interleaved = self.hq * self.wq <= _SMALL_PLANE
        self.n, self.c, self.size = n, c, n * c * self.hq * self.wq

    def phases(self, x: np.ndarray) -> tuple[dict[tuple[int, int], np.ndarray], list[Compute]]:
        """A buffer per phase, from the plan's arena, and the steps that refill it each
        call: zeros where the input does not reach, then the input's copy."""
        n, c, h, wd = x.shape
        (sh, sw), top, left = self.win.strides, self.win.pads[0], self.win.pads[1]
        hq, wq = self.hq, self.wq
        xt = x.transpose(0, 2, 3, 1) if self.interleaved else x
        tail = max(di * wq + dj for _, di, dj in self.taps)
        phases: dict[tuple[int, int], np.ndarray] = {}
        zeros: list[np.ndarray] = []
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        for a, b in sorted({phase for phase, _, _ in self.taps}):
            if self.interleaved:
                buf = temporary((n, hq, wq, c), x.dtype)
                grid = buf.transpose(0, 3, 1, 2)  # (N, C, rows, cols) views of both
            else:
                buf = temporary((self.size + tail,), x.dtype)
                grid = buf[: self.size].reshape(n, c, hq, wq)
                zeros.append(buf[self.size :])
            phases[a, b] = buf
            r0, q0 = -(-(top - a) // sh), -(-(left - b) // sw)  # first rows/cols of input
            r1, q1 = -(-(top + h - a) // sh), -(-(left + wd - b) // sw)
            r0, q0 = min(max(r0, 0), hq), min(max(q0, 0), wq)
            r1, q1 = max(min(r1, hq), r0), max(min(q1, wq), q0)
            zeros += [grid[:, :, :r0], grid[:, :, r1:], grid[:, :, r0:r1, :q0]]
            zeros.append(grid[:, :, r0:r1, q1:])
            if r1 > r0 and q1 > q0:
                rows = slice(r0 * sh + a - top, None, sh)
                cols = slice(q0 * sw + b - left, None, sw)
                if self.interleaved:
                    copies.append((buf[:, r0:r1, q0:q1, :], xt[:, rows, cols, :]))
                else:
                    copies.append((grid[:, :, r0:r1, q0:q1], x[:, :, rows, cols]))
        zeros = [v for v in zeros if v.size]
        copyto = np.copyto
        steps: list[Compute] = [partial(v.fill, 0) for v in zeros]
        steps += [partial(copyto, dst, src) for dst, src in copies]
        return phases, steps

    def operands(
        self, phases: dict[tuple[int, int], np.ndarray], w: np.ndarray, w_const: bool
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
        """Each tap's input view and weights, the accumulator, and the view of it that
        holds the output."""
        buf, n, c = next(iter(phases.values())), self.n, self.c
        (kh, kw), (oh, ow), hq, wq = self.win.kernel, self.win.out, self.hq, self.wq
        taps_w = [w[:, 0, i, j] for i in range(kh) for j in range(kw)]
        shape: tuple[int, ...]
        if self.interleaved:
            if w_const:
                shape = (n, oh, ow * c)
                weights = [np.tile(t, ow) for t in taps_w]
            else:
                shape, weights = (n, oh, ow, c), taps_w
            views = [
                phases[ph][:, di : di + oh, dj : dj + ow, :].reshape(shape)
                for ph, di, dj in self.taps
            ]
            acc = temporary(shape, buf.dtype)
            return views, weights, acc, acc.reshape(n, oh, ow, c).transpose(0, 3, 1, 2)
        plane, size = hq * wq, self.size
        if w_const and len(self.taps) * c * plane * buf.itemsize <= _EXPAND_LIMIT:
            shape = (n, c * plane)
            weights = [np.repeat(t, plane) for t in taps_w]
        else:  # too large to expand (or run-time weights): broadcast per channel
            shape, weights = (n, c, plane), [t.reshape(c, 1) for t in taps_w]
        views = [
            phases[ph][di * wq + dj : di * wq + dj + size].reshape(shape)
            for ph, di, dj in self.taps
        ]
        acc = temporary(shape, buf.dtype)
        return views, weights, acc, acc.reshape(n, c, hq, wq)[:, :, :oh, :ow]


def _planar_finish(
    out: np.ndarray, result: np.ndarray, bias: np.ndarray | None, bias_const: bool
) -> Compute:
    """The step writing the output view of the accumulator into `out`, adding the bias
    in the same pass."""
    copyto, add = np.copyto, np.add
    if bias is None:
        return lambda: copyto(out, result)
    b = bias.reshape(-1, 1, 1)
    if bias_const:
        b = np.ascontiguousarray(np.broadcast_to(b, out.shape[1:]))
    return lambda: add(result, b, out=out)
