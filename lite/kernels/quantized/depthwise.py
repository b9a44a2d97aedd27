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
from sporenet.lite.kernels.depthwise import (
    _einsum,
    channels_last_copies,
    channels_last_shape,
    channels_last_views,
)
from sporenet.lite.kernels.quantized.output_stage import OutputStage
from sporenet.lite.kernels.spatial import Window

MIN_CHANNELS = 8
"""Fewer channels make rows of C elements too short for the channels-last layout."""


def scratch_layout(
    win: Window,
    x_shape: tuple[int, ...],
    wide: np.dtype,
) -> list[tuple[tuple[int, ...], np.dtype]]:
    n, c = x_shape[:2]
    (kh, kw), (oh, ow) = win.kernel, win.out
    f32 = np.dtype(np.float32)
    return [
        (channels_last_shape(win, x_shape), f32),
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
    n, c = x.shape[:2]
    (kh, kw), (oh, ow) = win.kernel, win.out
    buf_f, wt, acc, wide, narrow = scratch
    narrow = narrow.view(out.dtype)
    buf = np.full(buf_f.shape, zx, x.dtype)  # the layer's own int8 buffer, border = z_x
    copies = channels_last_copies(win, buf, x)
    views = channels_last_views(win, buf_f)
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
