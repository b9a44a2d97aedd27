"""The Winograd path of Conv2D: F(2x2, 3x3) and F(4x4, 3x3) for 3x3, stride-1,
ungrouped convolutions with constant weights, one implementation for both transforms.

When each transform pays is Conv2D's choice (see the thresholds in conv.py).
"""

from __future__ import annotations

from collections.abc import Callable
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


BLOCK_BYTES = 1 << 21
"""The largest of a block's transform buffers (tiles x channels x (m+2)^2 values): tile
rows are taken in blocks this size, so the step's temporaries stay a few MiB whatever
the image size, while each GEMM still spans whole rows of tiles."""


@dataclass(frozen=True)
class _Buffers:
    """The step's block-sized temporaries, as flat float arrays."""

    d: np.ndarray  # gathered input tiles, (a, a, tiles, c)
    e: np.ndarray  # B^T applied once
    v: np.ndarray  # B^T d B, (a*a, tiles, c)
    m: np.ndarray  # the products, (a*a, tiles, o)
    p: np.ndarray  # A^T applied once
    y: np.ndarray  # output tiles, (t, t, tiles, o)
    r: np.ndarray  # the tiles in image order, where they overhang the output


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
    The transforms are four small GEMMs against B^T and A^T, each one BLAS call over a
    block of tile rows and every channel (F(4x4)'s matrices hold 4s, 5s and 8s, where
    additions would take about 22 passes each way): gather the block's input tiles
    channels-last with one strided copy, apply B^T to the tile rows and then to the
    tile columns, run the (m+2)^2 (tiles x C) @ (C x O) products, apply A^T twice, and
    copy the tiles into `out`. Blocks of BLOCK_BYTES bound the temporaries. `out` may be
    an NCHW view of channels-last memory, which takes the tiles in rows of O elements
    instead of a transposing copy. U = G w G^T is computed once at bind, in float64.
    The bias is added once to the transformed position (1, 1), whose row and column of
    A^T are all ones, so it enters every output of a tile exactly once.
    """
    n, c, h, wd = x.shape
    o = w.shape[0]
    oh, ow = win.out
    t, a = f.m, f.m + 2
    th, tw = -(-oh // t), -(-ow // t)  # a last row (column) of tiles may overhang
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
    item, empty = x.dtype.itemsize, np.empty(0, x.dtype)
    rows = max(1, min(th, BLOCK_BYTES // (a * a * tw * max(c, o) * item)))
    size = rows * tw
    planes = a * a * size
    buffers = _Buffers(
        d=temporary((planes * c,), x.dtype),
        e=temporary((planes * c,), x.dtype),
        v=temporary((planes * c,), x.dtype),
        m=temporary((planes * o,), x.dtype),
        p=temporary((t * a * size * o,), x.dtype),
        y=temporary((t * t * size * o,), x.dtype),
        r=temporary((t * t * size * o,), x.dtype) if (oh, ow) != (t * th, t * tw) else empty,
    )
    targets = _tile_targets(out, (n, th, tw, o), (oh, ow), t)
    blocks = [
        _bind_block(tiles_in[:, :, i, r : r + rows], u, bias, f, buffers, targets(i, r, rows))
        for i in range(n)
        for r in range(0, th, rows)
    ]
    copyto = np.copyto

    def compute() -> None:
        refill()
        copyto(interior, xt)
        for block in blocks:
            block()

    return compute


def _tile_targets(
    out: np.ndarray, tiles: tuple[int, int, int, int], size: tuple[int, int], t: int
) -> Callable[[int, int, int], tuple[np.ndarray, bool]]:
    """For image i and tile rows r..r+k: where its output tiles go, as a (t, t, k, tw, o)
    view of `out` (and True), or, when tiles overhang the output, a (rows, columns, o)
    view of the output rows they cover (and False)."""
    n, th, tw, o = tiles
    oh, ow = size
    last = is_channels_last(out)
    rows_last = out.transpose(0, 2, 3, 1) if last else out  # (n, oh, ow, o) or NCHW
    if oh == t * th and ow == t * tw:
        # out (n, o, th, t, tw, t), or its channels-last memory (n, th, t, tw, t, o), seen
        # as (t, t, n, th, tw, o): one copy (channels-last, in rows of o elements).
        if last:
            dense = rows_last.reshape(n, th, t, tw, t, o)
            dest = dense.transpose(2, 4, 0, 1, 3, 5)
        else:
            dest = out.reshape(n, o, th, t, tw, t).transpose(3, 5, 0, 2, 4, 1)
        return lambda i, r, k: (dest[:, :, i, r : r + k], True)

    def cropped(i: int, r: int, k: int) -> tuple[np.ndarray, bool]:
        y0, y1 = r * t, min((r + k) * t, oh)
        if last:
            return rows_last[i, y0:y1], False
        return out[i, :, y0:y1].transpose(1, 2, 0), False

    return cropped


def _bind_block(
    tiles_in: np.ndarray,
    u: np.ndarray,
    bias: np.ndarray | None,
    f: WinogradTransform,
    buf: _Buffers,
    target: tuple[np.ndarray, bool],
) -> Compute:
    """One block of tile rows: `tiles_in` its (a, a, k, tw, c) input tiles; `target`
    from _tile_targets."""
    a, _, k, tw, c = tiles_in.shape
    t, o, tiles = f.m, u.shape[2], k * tw
    dt = u.dtype
    bt, at = f.bt.astype(dt), f.at.astype(dt)
    d = buf.d[: a * a * tiles * c].reshape(a, a, k, tw, c)
    d2, e = d.reshape(a, -1), buf.e[: a * a * tiles * c].reshape(a, -1)
    e3, v = e.reshape(a, a, -1), buf.v[: a * a * tiles * c].reshape(a, a, -1)
    v3, m = v.reshape(a * a, tiles, c), buf.m[: a * a * tiles * o].reshape(a * a, tiles, o)
    m2, m11 = m.reshape(a, -1), m[a + 1]
    p = buf.p[: t * a * tiles * o].reshape(t, -1)
    p3, y = p.reshape(t, a, -1), buf.y[: t * t * tiles * o].reshape(t, t, k, tw, o)
    y3 = y.reshape(t, t, -1)
    copyto, add, matmul = np.copyto, np.add, np.matmul
    dest, whole = target
    if whole:
        store = _copier(dest, y)
    else:
        # Tiles overhang the output: in image order (k, t, tw, t, o) first, then cropped.
        r = buf.r[: t * t * tiles * o].reshape(k, t, tw, t, o)
        rows = r.reshape(k * t, tw * t, o)[: dest.shape[0], : dest.shape[1]]
        r_view, to_image, to_out = r.transpose(1, 3, 0, 2, 4), np.copyto, np.copyto

        def store() -> None:
            to_image(r_view, y)
            to_out(dest, rows)

    def compute() -> None:
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


def _copier(dest: np.ndarray, src: np.ndarray) -> Compute:
    copyto = np.copyto
    return lambda: copyto(dest, src)
