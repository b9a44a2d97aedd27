"""The 1x1 convolution as GEMMs (Conv2D's pointwise strategy): a 1x1, stride-1, unpadded,
ungrouped convolution is one product per image of the weights (O, C) with the (C, H*W)
view of the input, with no copy at all.

Variants, chosen by conv.Pointwise when it binds: channels-last input or output (the
transposed matrices, as BLAS reads them), a small plane under large weights (the head of
a MobileNet, multiplied transposed) and widening layers with a constant bias (the bias
rides in the GEMM under a copy of the narrower input).
"""

from __future__ import annotations

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels.activation import InPlace
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.conv_common import gemm, is_channels_last, with_epilogue
from sporenet.lite.kernels.workspace import temporary
from sporenet.lite.threads import BLAS

# Largest channels-last 1x1 output (bytes) whose constant bias is tiled over its rows, and
# the largest tile (bytes): a longer output is added the tile in runs of whole tiles.
_BIAS_TILE_LIMIT = 1 << 20
_BIAS_TILE_BYTES = 16 << 10


def bind_pointwise(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> Compute:
    """out = W x per image, both NCHW."""
    n, c, h, wd = x.shape
    o = w.shape[0]
    w2 = w.reshape(o, c)
    matmul = np.matmul
    if n == 1:
        return gemm(w2, x.reshape(c, h * wd), out.reshape(o, h * wd))
    x2, out2 = x.reshape(n, c, h * wd), out.reshape(n, o, h * wd)

    def compute() -> None:
        matmul(w2, x2, out=out2)

    return compute


def bind_pointwise_last(
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    bias_const: bool,
    act: InPlace | None,
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
    wt = np.ascontiguousarray(w.reshape(o, c).T)  # (C, O)
    add, copyto = np.add, np.copyto
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
    if n * hw * o * out.itemsize > _ROW_BLOCKS_MIN_BYTES and (
        is_channels_last(x) or (n == 1 and c >= _MIN_BLOCKED_NCHW_CHANNELS)
    ):
        pages.release_unless_read(w, wt)
        flat = rows.reshape(n * hw, c) if is_channels_last(x) else rows[0]
        return _bind_row_blocks(flat, wt, dense.reshape(n * hw, o), bias, bias_const, act)
    om = dense.reshape(n, hw, o)
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    target: np.ndarray = om
    b = None
    ones = None
    if bias_const and bias is not None and not is_channels_last(x):
        full = temporary((n, c + 1, hw), x.dtype)
        ones = full[:, c]  # rewritten every call: the buffer is shared with other steps
        copies.append((full[:, :c], x.reshape(n, c, hw)))
        rows = full.transpose(0, 2, 1)
        wt = np.concatenate([wt, bias.reshape(1, o)])
    elif bias_const and bias is not None and hw * o * out.itemsize <= _BIAS_TILE_LIMIT:
        # Contiguous runs of several rows instead of a broadcast over rows of O elements.
        rows_per_tile = _bias_tile_rows(hw, o * out.itemsize)
        b = np.tile(bias, rows_per_tile)
        target = dense.reshape(n, hw // rows_per_tile, rows_per_tile * o)
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


# Channels-last 1x1 outputs larger than this (bytes: most of the L2 cache) run in blocks of
# rows of about _ROW_BLOCK_BYTES of input and output each (see _bind_row_blocks).
_ROW_BLOCKS_MIN_BYTES = 768 << 10
_ROW_BLOCK_BYTES = 192 << 10
# Fewest channels of an NCHW input read in blocks of rows (its (H*W, C) matrix is
# transposed, each block a strided read of C rows): fewer run as one product.
_MIN_BLOCKED_NCHW_CHANNELS = 16


def _bind_row_blocks(
    rows: np.ndarray,
    wt: np.ndarray,
    om: np.ndarray,
    bias: np.ndarray | None,
    bias_const: bool,
    act: InPlace | None,
) -> Compute:
    """out = rows @ wt, then the bias and the activation, block of rows by block.

    On an output larger than the cache, the bias and activation passes after one
    whole-tensor product read it back from memory; on a block they find it in cache,
    and OpenBLAS multiplies the tall, narrow blocks (a few thousand rows by tens of
    channels) faster than the whole. Several BLAS threads keep the one call (the blocks
    would each run on all threads). A constant bias is added in runs of a tile of
    whole rows, as bind_pointwise_last does."""
    (m, c), o = rows.shape, wt.shape[1]
    per = min(m, max(_MIN_BLOCK_ROWS, _ROW_BLOCK_BYTES // ((c + o) * om.itemsize)))
    tiled = 1
    if bias is not None and bias_const:
        tiled = max(1, min(per, _BIAS_TILE_BYTES // (o * om.itemsize)))
        per = per // tiled * tiled
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = []
    tile = None if bias is None or tiled == 1 else np.tile(bias, tiled)
    for i in range(0, m, per):
        r, t = rows[i : i + per], om[i : i + per]
        if tile is not None and len(t) % tiled == 0:
            steps.append((r, t, t.reshape(-1, tiled * o), tile))
        else:
            steps.append((r, t, t, bias))
    matmul, add = np.matmul, np.add
    threads = BLAS.get if BLAS.available else (lambda: 1)

    def compute() -> None:
        if threads() != 1:
            matmul(rows, wt, out=om)
            if bias is not None:
                add(om, bias, out=om)
            if act is not None:
                act(om)
            return
        for r, t, target, b in steps:
            matmul(r, wt, out=t)
            if b is not None:
                add(target, b, out=target)
            if act is not None:
                act(t)

    return compute


# Fewest rows in one block of _bind_row_blocks: fewer would cost more in calls than the
# cache saves.
_MIN_BLOCK_ROWS = 64


def _bias_tile_rows(hw: int, row_bytes: int) -> int:
    """Output rows one tile of the bias spans: the most (a divisor of `hw`, so whole
    tiles cover the output) within _BIAS_TILE_BYTES."""
    most = max(1, _BIAS_TILE_BYTES // row_bytes)
    return max(d for d in range(1, min(hw, most) + 1) if hw % d == 0)


def bind_pointwise_head(
    x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None, act: InPlace | None
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
    add, copyto = np.add, np.copyto
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


def bind_pointwise_with_bias(
    x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray
) -> Compute:
    """out = [W b] [x; 1]: the constant bias as one more GEMM column, under a copy of x."""
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
