"""Quantized depthwise convolution, channels-last, with one float copy in shared scratch.

The float kernel's channels-last algorithm (lite/kernels/depthwise.py), adapted so the
only per-layer buffer is int8: the input is copied, transposed, into an int8 padded
(N, Hp, Wp, C) buffer whose border holds the zero point (set once); one pass converts
the whole buffer to float32 minus the zero point in the plan's scratch (the border
becomes 0.0, a real zero); a single einsum runs all kh*kw taps over strided views of it
(every 3x3 sum of 255 * 127 terms is exact in float32); the output stage requantizes the
channels-last accumulators into an int8 scratch image that one transposing copy writes to
the NCHW output. A column stride > 1 spreads the input into kw column-tap planes first,
so each tap still reads OW*C contiguous elements.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.depthwise import _einsum
from sporenet.lite.kernels.quantized.output_stage import OutputStage
from sporenet.lite.kernels.spatial import Window

MIN_CHANNELS = 8
"""Fewer channels make rows of C elements too short for the channels-last layout."""


def padded_shape(win: Window, x_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the int8 padded (or column-tap) buffer of the channels-last layout."""
    n, c, h, wd = x_shape
    hp = max(h + win.pads[0] + win.pads[2], win.extent[0])
    if win.strides[1] == 1:
        return (n, hp, max(wd + win.pads[1] + win.pads[3], win.extent[1]), c)
    return (n, hp, win.kernel[1], win.out[1], c)


def scratch_layout(
    win: Window,
    x_shape: tuple[int, ...],
    wide: np.dtype,
) -> list[tuple[tuple[int, ...], np.dtype]]:
    n, c = x_shape[:2]
    (kh, kw), (oh, ow) = win.kernel, win.out
    f32 = np.dtype(np.float32)
    return [
        (padded_shape(win, x_shape), f32),
        ((kh, kw, ow * c), f32),
        ((n, oh, ow * c), f32),
        ((n, oh, ow * c), wide),
        ((n, oh, ow, c), np.dtype(np.int8)),
    ]


def bind_depthwise_int8(
    win: Window,
    x: np.ndarray,
    w: np.ndarray,
    zx: int,
    stage: OutputStage,
    out: np.ndarray,
    scratch: list[np.ndarray],
) -> Compute:
    """The step writing `out` (N, C, OH, OW) from int8/uint8 x with shifted weights w."""
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = win.kernel, win.strides, win.dilations, win.out
    top, left = win.pads[0], win.pads[1]
    buf_f, wt, acc, wide, narrow = scratch
    narrow = narrow.view(out.dtype)
    buf = np.full(buf_f.shape, zx, x.dtype)  # the layer's own int8 buffer, border = z_x
    xt = x.transpose(0, 2, 3, 1)
    q = ow * c
    if sw == 1:
        copies = [(buf[:, top : top + h, left : left + wd, :], xt)]
        sn, sr, sc, se = buf_f.strides
        tap_strides = (sr * dh, sc * dw)
    else:
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
        sn, sr, sj, _, se = buf_f.strides
        tap_strides = (sr * dh, sj)
    views = np.lib.stride_tricks.as_strided(
        buf_f, shape=(kh, kw, n, oh, q), strides=(*tap_strides, sn, sr * sh, se), writeable=False
    )
    taps_w = w[:, 0].transpose(1, 2, 0)[:, :, None, :]  # (kh, kw, 1, C)
    wt4 = wt.reshape(kh, kw, ow, c)
    step = stage.bind(acc.reshape(n, oh, ow, c), narrow, wide.reshape(n, oh, ow, c))
    result = narrow.transpose(0, 3, 1, 2)
    zf = np.float32(zx)
    copyto, subtract, einsum = np.copyto, np.subtract, _einsum

    def compute() -> None:
        for dst, src in copies:
            copyto(dst, src)
        subtract(buf, zf, out=buf_f)
        copyto(wt4, taps_w)
        einsum("ijnpq,ijq->npq", views, wt, out=acc)
        step()
        copyto(out, result)

    return compute
