"""The im2col path of Conv2D: the column matrix of a window as a strided view of the
(padded) input, the copies that fill it, and the columns + GEMM steps built from them.

The column matrix is copied into a temporary taken at bind (kernels/workspace.py), then
multiplied with the weights (pre-shaped to (groups, out/groups, in/groups*kh*kw)) by BLAS;
a large one is built and multiplied in blocks of output rows (`_bind_row_blocks`), and
a batch's in blocks of images (`_bind_image_blocks`), or, for a stride-1 window with
more column rows than output channels, in whole padded rows (im2col_wide.py).
Narrow outputs with many channels build the columns channels-last instead
(`bind_im2col_hwc`), so the copy runs in rows of C elements rather than OW. Which of the
two runs is Conv2D's choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite import pages
from sporenet.lite.kernels.base import Compute
from sporenet.lite.kernels.conv_common import gemm, is_channels_last
from sporenet.lite.kernels.im2col_wide import bind_wide_rows, wide_rows_apply
from sporenet.lite.kernels.spatial import Window
from sporenet.lite.kernels.workspace import padded_temporary, temporary


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
            phase = temporary(part.shape, xp.dtype)
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


def bind_im2col(
    win: Window,
    group: int,
    x: np.ndarray,
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    bias_runtime: bool = False,
) -> Compute:
    """Columns + GEMM; with a (constant, ungrouped) bias, the column matrix gets an
    extra row of ones and the packed weights the bias as an extra column. A bias (and
    weights) read at run time rides in the GEMM the same way only in blocks of images
    (`bias_runtime`, where `in_image_blocks` holds): the packed weights are refreshed on
    every call."""
    g = group
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    oh, ow = win.out
    copyto = np.copyto
    by_phase = _by_phase(win)
    if by_phase and n == g == 1:
        return _bind_wide_phases(win, x, w, out, bias)
    if wide_rows_apply(win, g, x, out):
        return bind_wide_rows(win, x, w, out, bias, runtime=bias_runtime)
    refill = None
    if win.padded:
        h, wd = x.shape[2:]
        top, left, bottom, right = win.pads
        hp, wp = max(h + top + bottom, win.extent[0]), max(wd + left + right, win.extent[1])
        xp, refill = padded_temporary(
            (*x.shape[:2], hp, wp), x.dtype, (2, 3), (top, top + h), (left, left + wd)
        )
        interior = xp[:, :, top : top + h, left : left + wd]
    else:
        xp, interior = x, None
    src = im2col_view(xp, win)
    k = cg * kh * kw
    extra = 0 if bias is None else 1
    per_image = (k + extra) * oh * ow * x.itemsize
    limit = column_limit(out.nbytes)
    if n == g == 1 and not by_phase and per_image > limit:
        return _bind_row_blocks(win, src, (x, interior, refill), w, out, bias, limit)
    if in_image_blocks(win, g, x.shape, x.itemsize) and out.flags.c_contiguous:
        step = max(1, _BLOCK_BYTES // per_image)
        weights = (w, bias, bias_runtime)
        return _bind_image_blocks(src, (x, interior, refill), weights, out, step)
    if bias_runtime:
        raise ValueError("a run-time bias rides in the GEMM only in blocks of images")
    out_last = not out.flags.c_contiguous and out.transpose(0, 2, 3, 1).flags.c_contiguous
    cols, ones, wmat, cmat, omat = _gemm_operands(src, w, out, bias, g)
    # The copies that fill the columns: the padding's interior, then the columns
    # themselves (through the stride phases when the window is strided).
    copies = [] if interior is None else [(interior, x)]
    if by_phase:
        copies += phase_im2col_copies(xp, win, cols)
    else:
        copies.append((cols, src))
    lhs, rhs = wmat, cmat
    if out_last and n == g == 1:
        # `out` stored channels-last is the transposed (OH*OW, O) product: BLAS reads
        # the columns transposed, the weights are re-packed once to (K, O).
        lhs, rhs = cmat.T, np.ascontiguousarray(wmat.reshape(o, -1).T)
        omat = out.transpose(0, 2, 3, 1).reshape(oh * ow, o)
    product = gemm(lhs, rhs, omat)

    pages.release_unless_read(w, lhs, rhs)  # the weights, unless packed

    def compute() -> None:
        if refill is not None:
            refill()
        if ones is not None:
            ones.fill(1)
        for dst, part in copies:
            copyto(dst, part)
        product()

    return compute


def _by_phase(win: Window) -> bool:
    """Whether a strided window's columns are copied through its stride phases."""
    (kh, kw), (sh, sw) = win.kernel, win.strides
    phases = min(sh, kh) * min(sw, kw)
    return 1 < phases <= _MAX_PHASES and win.dilations == (1, 1)


def in_image_blocks(win: Window, group: int, x_shape: Sequence[int], itemsize: int) -> bool:
    """Whether bind_im2col builds and multiplies a batch's columns in blocks of images:
    an ungrouped, unphased window over several images whose columns (a row for a bias
    included) exceed _BLOCK_BYTES."""
    n, c = x_shape[:2]
    (kh, kw), (oh, ow) = win.kernel, win.out
    per_image = (c * kh * kw + 1) * oh * ow * itemsize
    return n > 1 and group == 1 and not _by_phase(win) and n * per_image > _BLOCK_BYTES


def _gemm_operands(
    src: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None, g: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """The column buffer (shaped as `src`, the (N, C, kh, kw, OH, OW) column view), its
    row of ones (with a bias), and the GEMM's weight, column and output matrices."""
    n, (oh, ow) = src.shape[0], src.shape[4:]
    o, cg, kh, kw = w.shape
    k, dtype = cg * kh * kw, src.dtype
    if bias is not None:
        full = temporary((n, k + 1, oh * ow), dtype)
        ones = full[:, k]  # rewritten every call: the buffer is shared with other steps
        cols = _strided(
            full, src.shape, (full.strides[0], *_contiguous_strides(src.shape[1:], src.itemsize))
        )
        wmat = np.concatenate([w.reshape(o, k), bias.reshape(o, 1)], axis=1)
        cmat = full[0] if n == 1 else full
        omat = out.reshape(o, -1) if n == 1 else out.reshape(n, o, oh * ow)
        return cols, ones, wmat, cmat, omat
    cols = temporary(src.shape, dtype)
    if g == 1 and n == 1:
        # The common case as one plain 2-D GEMM: (O, K) @ (K, OH*OW).
        return cols, None, w.reshape(o, k), cols.reshape(k, oh * ow), out.reshape(o, -1)
    wmat = w.reshape(g, o // g, k)
    return cols, None, wmat, cols.reshape(n, g, k, oh * ow), out.reshape(n, g, o // g, oh * ow)


def _bind_wide_phases(
    win: Window, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
) -> Compute:
    """Columns + GEMM of a strided, undilated window on one image, in whole phase rows.

    Each stride phase of the (implicitly padded) input is copied once, straight from the
    input, into a zeroed buffer whose rows are WQ wide (the widest phase). A tap at
    offset (u, v) inside its phase then reads the consecutive elements from u*WQ + v on,
    so the taps of a phase fill their column rows in one copy of long contiguous runs,
    where exact (OH, OW) windows copy OH rows of OW elements per tap (a stem's 27 taps of
    48x48 outputs: 1,296 short rows). The product has WQ - OW extra columns per output
    row, which the copy into `out` drops. With a bias, the columns get a row of ones and
    the weights the bias as a column. The columns and the product are built for blocks
    of output rows of about _WIDE_BLOCK_BYTES, so they stay small on a large image."""
    c, h, wd = x.shape[1:]
    o, _, kh, kw = w.shape
    (sh, sw), oh = win.strides, win.out[0]
    top, left = win.pads[0], win.pads[1]
    hp = max(h + top + win.pads[2], win.extent[0])
    wq = -(-max(wd + left + win.pads[3], win.extent[1]) // sw)
    # Rows per phase: the input's, and enough that the last tap's run stays inside.
    rows = max(-(-hp // sh), oh + -(-kh // sh))
    grid = [(a, b) for a in range(min(sh, kh)) for b in range(min(sw, kw))]
    ph = temporary((len(grid), c, rows, wq), x.dtype)
    k = c * kh * kw
    extra = 0 if bias is None else 1
    copies: list[tuple[np.ndarray, np.ndarray]] = []
    for p, (a, b) in enumerate(grid):
        r0, q0 = -(-(top - a) // sh), -(-(left - b) // sw)  # first phase row/col of input
        r1, q1 = -(-(top + h - a) // sh), -(-(left + wd - b) // sw)
        r0, q0 = max(r0, 0), max(q0, 0)
        if r1 > r0 and q1 > q0:
            y0, x0 = r0 * sh + a - top, q0 * sw + b - left
            y1, x1 = y0 + (r1 - r0 - 1) * sh + 1, x0 + (q1 - q0 - 1) * sw + 1
            src = x[0, :, y0:y1:sh, x0:x1:sw]
            copies.append((ph[p, :, r0:r1, q0:q1], src))
    wmat = w.reshape(o, k)
    if bias is not None:
        wmat = np.concatenate([wmat, bias.reshape(o, 1)], axis=1)
    block = max(1, min(oh, _WIDE_BLOCK_BYTES // ((k + extra) * wq * x.itemsize)))
    cols = temporary(((k + extra) * block * wq,), x.dtype)
    res = temporary((o * block * wq,), x.dtype)
    dense = out.transpose(0, 2, 3, 1)
    last = not out.flags.c_contiguous and dense.flags.c_contiguous
    wmat_t = np.ascontiguousarray(wmat.T) if last else wmat  # channels-last: re-packed once
    blocks = [
        _wide_block(
            ph,
            grid,
            (kh, kw, sh, sw),
            (cols, res),
            wmat_t,
            out,
            (r, min(block, oh - r)),
            (k + extra, last),
        )
        for r in range(0, oh, block)
    ]
    copyto = np.copyto

    def compute() -> None:
        ph.fill(0)  # the padding, and the tails that only dropped columns read
        for d, s in copies:
            copyto(d, s)
        for step in blocks:
            step()

    return compute


def _wide_block(
    ph: np.ndarray,
    grid: list[tuple[int, int]],
    window: tuple[int, int, int, int],
    buffers: tuple[np.ndarray, np.ndarray],
    wmat: np.ndarray,
    out: np.ndarray,
    rows: tuple[int, int],
    layout: tuple[int, bool],
) -> Compute:
    """_bind_wide_phases' step for `rows` (first output row, count): its columns from the
    phase buffers `ph` into the flat `buffers[0]`, the product with `wmat` ((O, K) or,
    for channels-last `out`, (K, O)) into `buffers[1]`, and the copy into those rows of
    `out`. `layout` is (K, with the bias row, or not; channels-last `out`)."""
    kh, kw, sh, sw = window
    (r0, n), (kr, last) = rows, layout
    c, wq = ph.shape[1], ph.shape[3]
    o, span, k = out.shape[1], n * wq, c * kh * kw
    ow = out.shape[3]
    cols = buffers[0][: kr * span].reshape(kr, span)
    taps = cols[:k].reshape(c, kh, kw, span)
    fills = []
    for p, (a, b) in enumerate(grid):
        ku, kv = -(-(kh - a) // sh), -(-(kw - b) // sw)
        sc, sr, se = ph.strides[1:]
        runs = np.lib.stride_tricks.as_strided(
            ph[p, :, r0:], shape=(c, ku, kv, span), strides=(sc, sr, se, se), writeable=False
        )
        fills.append((taps[:, a::sh, b::sw], runs))
    ones = cols[k] if kr > k else None  # rewritten every call: the buffer is shared
    if last:
        res = buffers[1][: span * o].reshape(span, o)
        lhs, rhs = cols.T, wmat
        kept, dst = res.reshape(n, wq, o)[:, :ow], out.transpose(0, 2, 3, 1)[0, r0 : r0 + n]
    else:
        res = buffers[1][: o * span].reshape(o, span)
        lhs, rhs = wmat, cols
        kept, dst = res.reshape(o, n, wq)[:, :, :ow], out[0, :, r0 : r0 + n]
    copyto, product = np.copyto, gemm(lhs, rhs, res)

    def compute() -> None:
        if ones is not None:
            ones.fill(1)
        for d, s in fills:
            copyto(d, s)
        product()
        copyto(dst, kept)

    return compute


def _bind_row_blocks(
    win: Window,
    src: np.ndarray,
    inputs: tuple[np.ndarray, np.ndarray | None, Compute | None],
    w: np.ndarray,
    out: np.ndarray,
    bias: np.ndarray | None,
    limit: int,
) -> Compute:
    """Columns + GEMM over blocks of output rows, for one image whose column matrix is
    large (a 96-channel 3x3 layer on a 120x160 map has 66 MB of columns): each block's
    columns (about `limit` bytes, see column_limit) are written and multiplied while
    still in cache, and the GEMM writes the block's rows of `out` in place. The one
    block-sized buffer is a temporary, so the step's memory stays bounded whatever the
    plane's size. `inputs`: the input, the padding's interior in the padded copy (or None)
    and the step that refills that copy's border."""
    x, interior, refill = inputs
    o, cg, kh, kw = w.shape
    oh, ow = win.out
    k = cg * kh * kw
    rows = k + (0 if bias is None else 1)
    wmat = w.reshape(o, k)
    if bias is not None:
        wmat = np.concatenate([wmat, bias.reshape(o, 1)], axis=1)
    block = max(1, min(oh, limit // (rows * ow * x.itemsize)))
    buf = temporary((rows, block * ow), x.dtype)
    # Row k carries the bias: no copy writes it, but the buffer is shared with other
    # steps, so it is rewritten on every call.
    ones = buf[k] if bias is not None else None
    last = not out.flags.c_contiguous and out.transpose(0, 2, 3, 1).flags.c_contiguous
    if last:  # `out` stored channels-last: each block is the transposed product
        out2, wmat = out.transpose(0, 2, 3, 1).reshape(oh * ow, o), np.ascontiguousarray(wmat.T)
    else:
        out2 = out.reshape(o, oh * ow)
    steps = []
    for r0 in range(0, oh, block):
        r1 = min(oh, r0 + block)
        span = (r1 - r0) * ow
        dst = _strided(
            buf,
            (cg, kh, kw, r1 - r0, ow),
            (*_contiguous_strides((cg, kh, kw), buf.strides[0]), ow * x.itemsize, x.itemsize),
        )
        rows_out = slice(r0 * ow, r0 * ow + span)
        omat = out2[rows_out] if last else out2[:, rows_out]
        steps.append((dst, src[0, :, :, :, r0:r1], buf[:, :span], omat))
    copyto, matmul = np.copyto, np.matmul

    pages.release_unless_read(w, wmat)

    def compute() -> None:
        if refill is not None:
            refill()
        if ones is not None:
            ones.fill(1)
        if interior is not None:
            copyto(interior, x)
        for dst, part, cmat, omat in steps:
            copyto(dst, part)
            if last:
                matmul(cmat.T, wmat, out=omat)
            else:
                matmul(wmat, cmat, out=omat)

    return compute


def _bind_image_blocks(
    src: np.ndarray,
    padding: tuple[np.ndarray, np.ndarray | None, Compute | None],
    weights: tuple[np.ndarray, np.ndarray | None, bool],
    out: np.ndarray,
    step: int,
) -> Compute:
    """Columns + GEMM of a batch, `step` images at a time (about _BLOCK_BYTES of
    columns): each block's columns are multiplied while still in cache, where the whole
    batch's would be written to memory and read back. `padding` is (x, the padded
    buffer's interior or None, its refill or None); `weights` is (w, bias or None,
    whether both are read at run time, so packed again on every call)."""
    x, interior, refill = padding
    w, bias, runtime = weights
    n, (oh, ow) = src.shape[0], src.shape[4:]
    o, cg, kh, kw = w.shape
    k = cg * kh * kw
    extra = 0 if bias is None else 1
    full = temporary((step, k + extra, oh * ow), x.dtype)
    cols = _strided(
        full,
        (step, *src.shape[1:]),
        (full.strides[0], *_contiguous_strides(src.shape[1:], x.itemsize)),
    )
    # Row k carries the bias; the buffer is shared with other steps, so it is rewritten
    # on every call.
    ones = full[:, k] if bias is not None else None
    wmat = w.reshape(o, k)
    repack = []
    if bias is not None and runtime:
        wmat = np.empty((o, k + 1), w.dtype)
        repack = [(wmat[:, :k].reshape(w.shape), w), (wmat[:, k], bias)]
    elif bias is not None:
        wmat = np.concatenate([wmat, bias.reshape(o, 1)], axis=1)
    out3 = out.reshape(n, o, oh * ow)
    blocks = [
        (cols[:m], src[i : i + m], full[:m], out3[i : i + m])
        for i in range(0, n, step)
        for m in [min(step, n - i)]
    ]
    copyto, matmul = np.copyto, np.matmul

    if not runtime:
        pages.release_unless_read(w, wmat)

    def compute() -> None:
        for dst, part in repack:
            copyto(dst, part)
        if refill is not None:
            refill()
        if interior is not None:
            copyto(interior, x)
        if ones is not None:
            ones.fill(1)
        for dst, part, cmat, omat in blocks:
            copyto(dst, part)
            matmul(wmat, cmat, out=omat)

    return compute


def bind_im2col_hwc(
    win: Window, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None
) -> Compute:
    """im2col for narrow outputs with many channels, built channels-last.

    With OW small, NCHW columns are copied in rows of OW elements (a 4x4 output of 512
    channels means 18k rows of 4). Transposing the input once to (N, H, W, C) makes
    the transposed column matrix (OH*OW, kh*kw*C) copy in rows of C elements; the
    weights are re-packed at bind to (O, kh, kw, C) order and BLAS reads the columns
    transposed, so the GEMM needs no extra copy. An input stored channels-last needs no
    transposing copy either (an unpadded window none at all: the columns gather from the
    input), and an output stored so is the plain (OH*OW, O) product.
    A batch is one GEMM over all its images' columns (`_hwc_operands`).
    """
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (oh, ow), (sh, sw), (dh, dw) = win.out, win.strides, win.dilations
    top, left = win.pads[0], win.pads[1]
    hp, wp = (
        max(h + top + win.pads[2], win.extent[0]),
        max(wd + left + win.pads[3], win.extent[1]),
    )
    xt = x.transpose(0, 2, 3, 1)
    fills: list[tuple[np.ndarray, np.ndarray]] = []
    refill: Compute | None = None
    if (hp, wp) == (h, wd):
        xp = xt  # unpadded: the columns gather from the input's own strides
    else:
        xp, refill = padded_temporary(
            (n, hp, wp, c), x.dtype, (1, 2), (top, top + h), (left, left + wd)
        )
        fills.append((xp[:, top : top + h, left : left + wd, :], xt))
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
    full = temporary((n, oh * ow, k + extra), x.dtype)
    ones = full[:, :, k] if extra else None  # rewritten every call, as in bind_im2col
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
    lhs, cmat, omat, spread = _hwc_operands(full, wmat, out)
    copyto, matmul = np.copyto, np.matmul

    pages.release_unless_read(w, lhs, cmat)

    def compute() -> None:
        if refill is not None:
            refill()
        if ones is not None:
            ones.fill(1)
        for dst, part in fills:
            copyto(dst, part)
        copyto(cols, src)
        matmul(lhs, cmat, out=omat)
        if spread is not None:
            copyto(*spread)

    return compute


def _hwc_operands(
    full: np.ndarray, wmat: np.ndarray, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """The GEMM lhs, rhs and output of bind_im2col_hwc's (N, OH*OW, K) columns `full` and
    packed (O, K) weights, and the copy of the product into `out` when it needs one."""
    n, positions, _ = full.shape
    o = wmat.shape[0]
    if n == 1 and is_channels_last(out):
        # `out` stored channels-last is the (OH*OW, O) product of the columns as they
        # are by the weights re-packed once to (K, O).
        return full[0], np.ascontiguousarray(wmat.T), out.transpose(0, 2, 3, 1).reshape(-1, o), None
    if n == 1:
        return wmat, full[0].T, out.reshape(o, positions), None
    # A batch: one GEMM over every image's columns (image by image, BLAS would multiply
    # with only OH*OW columns each), its (O, N*OH*OW) result then copied into out's
    # (N, O, OH*OW) once.
    res = temporary((o, n * positions), full.dtype)
    spread = (out.reshape(n, o, positions), res.reshape(o, n, positions).transpose(1, 0, 2))
    return wmat, full.reshape(n * positions, -1).T, res, spread


# Largest column matrix (bytes) built whole; larger ones are built in blocks of output
# rows of about this size, each multiplied while it is in cache (see _bind_row_blocks).
_BLOCK_BYTES = 1 << 20

# A one-image layer's column blocks may shrink to this size when its output is smaller
# (column_limit).
_MIN_BLOCK_BYTES = 256 << 10


def column_limit(out_bytes: int) -> int:
    """Largest column matrix (bytes) a one-image layer writing `out_bytes` builds whole.

    The columns are a temporary, and on a small net (an audio front end's few hundred KiB
    of activations) a layer's whole column matrix, kh*kw times its input, is the arena's
    peak: larger than any tensor the plan holds. So the columns are no larger than the
    layer's output, down to _MIN_BLOCK_BYTES, where blocks of output rows still multiply as
    fast as the whole matrix (they fit any core's L2); at most _BLOCK_BYTES."""
    return min(_BLOCK_BYTES, max(_MIN_BLOCK_BYTES, out_bytes))


# The column block of a strided one-image layer (_bind_wide_phases). A vision net's stem
# (3 input channels, stride 2) has the largest temporaries of the whole plan, so this
# block sets the arena's peak; blocks of a few output rows multiply as fast as whole
# megabytes (its runs are long, and the GEMM's K and O are small).
_WIDE_BLOCK_BYTES = 256 << 10

# Most stride phases worth copying separately (see phase_im2col_copies): each costs two
# copy calls, so a long stride (a strided 1-D convolution over audio frames, stride 128)
# copies its columns straight from the input instead.
_MAX_PHASES = 16


def _contiguous_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def _strided(base: np.ndarray, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """A writable view of `base` with explicit shape and strides (within its bounds)."""
    return np.lib.stride_tricks.as_strided(base, shape=tuple(shape), strides=tuple(strides))
