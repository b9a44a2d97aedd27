"""The wide-row columns + GEMM path of a stride-1 Conv2D over a batch of images.

With stride 1, output position (oh, ow) reads the padded plane (Hp x Wp, stored flat)
from index oh * Wp + ow on. Taken as OH whole padded rows of Wp positions, tap (i, j)'s
column row is then one contiguous run of OH * Wp elements starting at i * dh * Wp +
j * dw, so filling the columns copies C * kh * kw runs of OH * Wp elements per image where
exact (OH, OW) windows copy OH times as many runs of OW (a 14x14 map: one run of 224
against 14 of 14). Each output row of the product then has Wp - OW extra columns (read
from the row's padding and the next row's start, or from a tail past the plane), which
the copy into `out` drops.
"""

from __future__ import annotations

import numpy as np

from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.conv_common import unpacked_parts
from sporenet.lite.kernels.spatial import Window
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.threads import BLAS

_BLOCK_BYTES = 1 << 20
"""Bytes of columns per block of images (each block's columns are multiplied while
still in cache)."""


class WideRows:
    """A stride-1 window's wide-row geometry over an (N, C, H, W) input: the padded plane
    (rows x width, stored flat with a tail so the last tap's run stays inside) and the
    columns' length (OH whole padded rows)."""

    def __init__(self, win: Window, shape: tuple[int, ...]) -> None:
        self.win, self.shape = win, shape
        h, w = shape[2:]
        top, left, bottom, right = win.pads
        self.rows = max(h + top + bottom, win.extent[0])
        self.width = max(w + left + right, win.extent[1])
        self.tail = (win.kernel[1] - 1) * win.dilations[1]
        self.length = win.out[0] * self.width

    def padded(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """A zeroed flat padded buffer (N, C, rows * width + tail) and its (N, C, H, W)
        interior; the caller's own, so the padding stays zero between calls."""
        n, c, h, w = self.shape
        buffer = np.zeros((n, c, self.rows * self.width + self.tail), dtype)
        grid = buffer[:, :, : self.rows * self.width].reshape(n, c, self.rows, self.width)
        top, left = self.win.pads[:2]
        return buffer, grid[:, :, top : top + h, left : left + w]

    def columns(self, buffer: np.ndarray) -> np.ndarray:
        """Read-only (N, C, kh, kw, OH * width) view of a padded buffer: its columns."""
        (kh, kw), (dh, dw) = self.win.kernel, self.win.dilations
        sn, sc, se = buffer.strides
        return np.lib.stride_tricks.as_strided(
            buffer,
            shape=(*buffer.shape[:2], kh, kw, self.length),
            strides=(sn, sc, dh * self.width * se, dw * se, se),
            writeable=False,
        )


def wide_rows_pay(win: Window, shape: tuple[int, ...]) -> bool:
    """Whether a stride-1 window's wide rows waste under a fifth of each row (OW of every
    Wp positions are kept): the filter gradient's product runs over the extra positions
    too, which on a small map (8x8 padded to 10x10) costs more than the long runs save."""
    if win.strides != (1, 1):
        return False
    ow = win.out[1]
    return 5 * ow > 4 * WideRows(win, shape).width


def wide_rows_apply(win: Window, group: int, x: np.ndarray, out: np.ndarray) -> bool:
    """Whether a layer runs as wide rows: stride 1, one group, several images (one image
    takes the row-block paths), an NCHW output, and at least as many column rows as
    output channels (the copy that drops the extra columns costs in proportion to the
    output; the runs saved, to the columns: a 1-channel input's 9 rows gain less than
    16 output channels cost)."""
    k = x.shape[1] * win.kernel[0] * win.kernel[1]
    return (
        win.strides == (1, 1)
        and group == 1
        and x.shape[0] > 1
        and out.flags.c_contiguous
        and k >= out.shape[1]
    )


def bind_wide_rows(
    win: Window,
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    *,
    runtime: bool,
) -> Compute:
    """Columns (with a row of ones for a bias) + GEMM for blocks of images; the weights
    (and bias) are packed into one (O, K + 1) matrix on every call when `runtime` (read
    at run time, as a training graph's are), else once here. A block's columns are laid
    out (K, images, OH * Wp), so the block is one product (O, K) @ (K, images * OH * Wp):
    OpenBLAS packs the weights once per block, not once per image (a 14x14 map of 16
    channels, 8 images: the products alone 1.1-1.3x faster, the layer 1-3%). On one BLAS thread a
    product is split into column blocks OpenBLAS multiplies unpacked (as gemm does)."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    oh, ow = win.out
    plane = WideRows(win, x.shape)
    xp, interior = plane.padded(x.dtype)
    src = plane.columns(xp)
    length, wp = plane.length, plane.width
    k = c * kh * kw
    rows = k + (0 if bias is None else 1)
    step = max(1, min(n, _BLOCK_BYTES // (rows * length * x.itemsize)))
    # Flat, so a short last block is a whole (rows, m * length) matrix at its start.
    full = temporary((rows * step * length,), x.dtype)
    res = temporary((o * step * length,), x.dtype)
    wmat, repack = _packed_weights(w, bias, runtime)
    blocks = []
    for i in range(0, n, step):
        m = min(step, n - i)
        span = m * length
        cmat, omat = full[: rows * span].reshape(rows, span), res[: o * span].reshape(o, span)
        cols = cmat[:k].reshape(c, kh, kw, m, length)
        width = -(-span // unpacked_parts(o * rows * span))
        split = [(cmat[:, a : a + width], omat[:, a : a + width]) for a in range(0, span, width)]
        kept = omat.reshape(o, m, oh, wp)[:, :, :, :ow].transpose(1, 0, 2, 3)
        ones = cmat[k] if bias is not None else None  # shared buffer: rewritten per call
        part = src[i : i + m].transpose(1, 2, 3, 0, 4)
        blocks.append((cols, part, ones, (cmat, omat), split, kept, out[i : i + m]))
    copyto, matmul = np.copyto, np.matmul
    threads = BLAS.get if BLAS.available else (lambda: 1)

    def compute() -> None:
        for dst, part in repack:
            copyto(dst, part)
        copyto(interior, x)
        one_thread = threads() == 1  # as gemm: split products would each run on one
        for dst, part, ones, whole, split, kept, target in blocks:
            if ones is not None:
                ones.fill(1)
            copyto(dst, part)
            for cmat, omat in split if one_thread else [whole]:
                matmul(wmat, cmat, out=omat)
            copyto(target, kept)

    return compute


def _packed_weights(
    w: np.ndarray, bias: np.ndarray | None, runtime: bool
) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The (O, K [+ 1]) weight matrix and the copies that refresh it per call (none for
    constant weights, or without a bias: the weights' own reshape is read in place)."""
    o = w.shape[0]
    k = w[0].size
    if bias is None:
        return w.reshape(o, k), []
    if not runtime:
        return np.concatenate([w.reshape(o, k), bias.reshape(o, 1)], axis=1), []
    wmat = np.empty((o, k + 1), w.dtype)
    return wmat, [(wmat[:, :k].reshape(w.shape), w), (wmat[:, k], bias)]
