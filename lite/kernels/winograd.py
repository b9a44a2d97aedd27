"""The Winograd path of Conv2D: F(2x2, 3x3) and F(4x4, 3x3) for 3x3, stride-1,
ungrouped convolutions with constant weights, one implementation for both transforms.

When each transform pays is Conv2D's choice (see the thresholds in conv.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.conv_common import is_channels_last
from sporenet.lite.kernels.spatial import Window
from sporenet.lite.kernels.workspace import padded_temporary, temporary


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


def _kron_g(f: WinogradTransform) -> np.ndarray:
    """G (x) G as an ((m+2)^2, 9) matrix: row (k, l), column (i, j) holds G[k, i] G[l, j]."""
    a = f.m + 2
    return (f.g[:, None, :, None] * f.g[None, :, None, :]).reshape(a * a, 9)


def bind_winograd(
    win: Window,
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
    cropped buffer). `out` may be an NCHW view of channels-last memory, which takes the
    tiles in rows of O elements instead of a transposing copy. U = G w G^T is computed
    once at bind, in float64. The bias is added once to the transformed position (1, 1),
    whose row and column of A^T are all ones, so it enters every output of a tile
    exactly once.
    """
    n, c, h, wd = x.shape
    o = w.shape[0]
    oh, ow = win.out
    t, a = f.m, f.m + 2
    th, tw = -(-oh // t), -(-ow // t)  # a last row (column) of tiles may overhang
    tiles = n * th * tw
    top, left = win.pads[0], win.pads[1]
    xp, refill = padded_temporary(
        (n, t * th + 2, t * tw + 2, c), x.dtype, (1, 2), (top, top + h), (left, left + wd)
    )
    interior, xt = xp[:, top : top + h, left : left + wd], x.transpose(0, 2, 3, 1)
    sn, sy, sx, sc = xp.strides
    tiles_in = np.lib.stride_tricks.as_strided(
        xp,
        shape=(a, a, n, th, tw, c),
        strides=(sy, sx, sn, t * sy, t * sx, sc),
        writeable=False,
    )
    # U[k, l, c, o] = sum_ij G[k, i] G[l, j] w[o, c, i, j]: one float64 GEMM of the
    # (a*a, 9) Kronecker product of G with itself by the weights laid out (9, C*O).
    w9 = w.transpose(2, 3, 1, 0).reshape(9, c * o).astype(np.float64)
    u = (_kron_g(f) @ w9).astype(x.dtype).reshape(a * a, c, o)
    bt, at = f.bt.astype(x.dtype), f.at.astype(x.dtype)
    d = temporary((a, a, n, th, tw, c), x.dtype)
    e = temporary((a, a * tiles * c), x.dtype)
    v = temporary((a, a, tiles * c), x.dtype)
    m = temporary((a * a, tiles, o), x.dtype)
    p = temporary((t, a * tiles * o), x.dtype)
    y = temporary((t, t, n, th, tw, o), x.dtype)
    d2, e3, v3 = d.reshape(a, -1), e.reshape(a, a, -1), v.reshape(a * a, tiles, c)
    m2, p3, y3, m11 = m.reshape(a, -1), p.reshape(t, a, -1), y.reshape(t, t, -1), m[a + 1]
    copyto, add, matmul = np.copyto, np.add, np.matmul
    last = is_channels_last(out)
    if oh == t * th and ow == t * tw:
        # out (n, o, th, t, tw, t), or its channels-last memory (n, th, t, tw, t, o), seen
        # as y's (t, t, n, th, tw, o): one copy (channels-last, in rows of o elements).
        if last:
            dense = out.transpose(0, 2, 3, 1).reshape(n, th, t, tw, t, o)
            dest = dense.transpose(2, 4, 0, 1, 3, 5)
        else:
            dest = out.reshape(n, o, th, t, tw, t).transpose(3, 5, 0, 2, 4, 1)

        def store() -> None:
            copyto(dest, y)
    else:
        res = temporary((n, th, t, tw, t, o), x.dtype)
        res_view = res.transpose(2, 4, 0, 1, 3, 5)
        back = res.reshape(n, t * th, t * tw, o)[:, :oh, :ow]
        target = out.transpose(0, 2, 3, 1) if last else out
        if not last:
            back = back.transpose(0, 3, 1, 2)

        def store() -> None:
            copyto(res_view, y)
            copyto(target, back)

    def compute() -> None:
        refill()
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
