"""Winograd F(m x m, 3 x 3) convolution for 3x3, stride-1, dilation-1, ungrouped layers.

A 3x3 convolution computes each m x m block of output from an (m+2) x (m+2) tile of
input. Winograd's minimal filtering algorithm (Lavin & Gray, 2015) writes that as

    Y = A^T [ (G g G^T) * (B^T d B) ] A

with `*` elementwise over the (m+2)^2 tile positions. Summed over input channels, each
position is an independent matrix product, so the whole layer becomes (m+2)^2 GEMMs of
(tiles, C) x (C, O) instead of one (O, 9C) x (9C, OH*OW) GEMM: F(2x2, 3x3) needs 16
multiplies per 4 outputs (2.25x fewer than 36), F(4x4, 3x3) 36 per 16 (4x fewer).

Prepare once, compute many: the weight transform U = G g G^T is done at construction (in
float64) and stored as (positions, C, O); `bind` allocates a channels-last padded input,
the transformed input V (positions, tiles, C) and the products M (positions, tiles, O)
once, and compiles both transforms into a flat list of ufunc calls on strided views
(whole layers at a time, never a Python loop over tiles). The compute closure only runs
those calls, one batched matmul and one transposing copy into `out`.

Odd output sizes: the tile grid is rounded up; tiles hanging over the bottom/right edge
read zero padding and their extra outputs are cropped away by the final copy.

Measured here (one thread, OpenBLAS Haswell kernels): F(2x2, 3x3) beats im2col by 10-30%
when min(C, O) >= 32 and min(C, O) * tiles >= ~3000, and loses up to 2x below that (16
channels, or a few tiles). F(4x4, 3x3) stays within 1e-5 relative error but is slower
than F(2x2, 3x3) at every ResNet-18 shape measured: its transforms (coefficients 4, 5,
1/6...) cost more NumPy passes than its smaller GEMMs save.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from sporenet.lite.errors import ShapeError

Compute = Callable[[], None]
InPlace = Callable[[np.ndarray], None]

# Transform matrices (Lavin & Gray; interpolation points 0, +-1 for m=2 and 0, +-1, +-2
# for m=4, plus the point at infinity). Keyed by the output tile size m.
_BT = {
    2: np.array([[1, 0, -1, 0],
                 [0, 1, 1, 0],
                 [0, -1, 1, 0],
                 [0, 1, 0, -1]], np.float64),
    4: np.array([[4, 0, -5, 0, 1, 0],
                 [0, -4, -4, 1, 1, 0],
                 [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0],
                 [0, 2, -1, -2, 1, 0],
                 [0, 4, 0, -5, 0, 1]], np.float64),
}
_G = {
    2: np.array([[1, 0, 0],
                 [1 / 2, 1 / 2, 1 / 2],
                 [1 / 2, -1 / 2, 1 / 2],
                 [0, 0, 1]], np.float64),
    4: np.array([[1 / 4, 0, 0],
                 [-1 / 6, -1 / 6, -1 / 6],
                 [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 24, 1 / 12, 1 / 6],
                 [1 / 24, -1 / 12, 1 / 6],
                 [0, 0, 1]], np.float64),
}
_AT = {
    2: np.array([[1, 1, 1, 0],
                 [0, 1, -1, -1]], np.float64),
    4: np.array([[1, 1, 1, 1, 1, 0],
                 [0, 1, -1, 2, -2, 0],
                 [0, 1, 1, 4, 4, 0],
                 [0, 1, -1, 8, -8, 1]], np.float64),
}
TILE_SIZES = tuple(sorted(_AT))

# One step of a compiled transform: ufunc(*inputs, out=output).
_Step = tuple[Callable[..., object], tuple[object, ...], np.ndarray]


def transform_weights(weights: np.ndarray, m: int = 2) -> np.ndarray:
    """U = G g G^T for every (out, in) filter, as a contiguous (positions, C, O) array
    (the right-hand side of the channels-last GEMM), computed in float64."""
    g = _G[m]
    o, c = weights.shape[:2]
    u = np.einsum("ai,ocij,bj->abco", g, weights.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape((m + 2) ** 2, c, o), dtype=weights.dtype)


class Winograd3x3:
    """A prepared 3x3 / stride 1 / dilation 1 / group 1 convolution of one input shape.

    weights (O, C, 3, 3) and an optional bias (O,) are constants; x_shape is (N, C, H, W);
    pads are [top, left, bottom, right]; activation is an in-place function or None.
    `m` is the output tile size (2 or 4). `bind(x, out)` returns the compute closure.
    """

    def __init__(self, weights: np.ndarray, bias: np.ndarray | None,
                 x_shape: Sequence[int], pads: Sequence[int],
                 activation: InPlace | None = None, *, m: int = 2) -> None:
        if m not in _AT:
            raise ShapeError(f"Winograd3x3: tile size m must be one of {TILE_SIZES}, got {m}")
        if weights.ndim != 4 or weights.shape[2:] != (3, 3):
            raise ShapeError(f"Winograd3x3: weights must be (O, C, 3, 3), got shape "
                             f"{list(weights.shape)}")
        if weights.dtype.kind != "f":
            raise ShapeError(f"Winograd3x3: weights must be float, got {weights.dtype}")
        if len(x_shape) != 4 or x_shape[1] != weights.shape[1]:
            raise ShapeError(f"Winograd3x3: input must be (N, {weights.shape[1]}, H, W), got "
                             f"shape {list(x_shape)}")
        if len(pads) != 4 or any(p < 0 for p in pads):
            raise ShapeError(f"Winograd3x3: pads must be 4 non-negative values [top, left, "
                             f"bottom, right], got {list(pads)}")
        o = weights.shape[0]
        if bias is not None and bias.shape != (o,):
            raise ShapeError(f"Winograd3x3: bias must have shape [{o}], got {list(bias.shape)}")
        n, c, h, w = (int(v) for v in x_shape)
        top, left, bottom, right = (int(p) for p in pads)
        oh, ow = h + top + bottom - 2, w + left + right - 2
        if oh < 1 or ow < 1:
            raise ShapeError(f"Winograd3x3: 3x3 window is larger than the padded input "
                             f"{[h, w]} + pads {list(pads)}")
        self.m = m
        self.x_shape = (n, c, h, w)
        self.pads = (top, left, bottom, right)
        self.out_shape = (n, o, oh, ow)
        self.dtype = weights.dtype
        self.u = transform_weights(weights, m)
        self.bias = None if bias is None else bias.astype(self.dtype)
        self.activation = activation

    def bind(self, x: np.ndarray, out: np.ndarray) -> Compute:
        """Allocate the scratch buffers for these arrays and return the compute closure."""
        if x.shape != self.x_shape or out.shape != self.out_shape:
            raise ShapeError(f"Winograd3x3: prepared for input {list(self.x_shape)} -> "
                             f"output {list(self.out_shape)}, bound to {list(x.shape)} -> "
                             f"{list(out.shape)}")
        m, dt = self.m, self.dtype
        r = m + 2  # input tile size
        n, c, h, w = self.x_shape
        o, (oh, ow) = self.out_shape[1], self.out_shape[2:]
        top, left = self.pads[:2]
        th, tw = -(-oh // m), -(-ow // m)  # tiles down and across
        tiles = n * th * tw
        # Channels-last padded input, zero border written once. Channels-last keeps every
        # transform step on rows of C contiguous values; in NCHW the column steps would
        # run over rows of only tw elements. The grid is rounded up to whole tiles: the
        # extra rows and columns read zeros and their outputs are cropped away.
        xp = np.zeros((n, m * th + 2, m * tw + 2, c), dt)
        interior, xt = xp[:, top:top + h, left:left + w], x.transpose(0, 2, 3, 1)

        # Input transform, rows then columns (each step over all tiles at once):
        # V[a, b] = sum_kl BT[a, k] BT[b, l] d[k, l].
        bt = _BT[m]
        rows = np.empty((r, n, th, m * tw + 2, c), dt)
        taps = [xp[:, k:k + m * (th - 1) + 1:m] for k in range(r)]
        steps = _combine_all(bt, taps, list(rows), _scratch(bt, rows[0]))
        v = np.empty((r, r, n, th, tw, c), dt)
        v_cols = v.transpose(1, 0, 2, 3, 4, 5)  # [b] -> (a, n, th, tw, c)
        cols = [rows[:, :, :, k:k + m * (tw - 1) + 1:m] for k in range(r)]
        steps += _combine_all(bt, cols, list(v_cols), _scratch(bt, v_cols[0]))

        # One batched GEMM: (tiles, C) @ (C, O) at each of the r*r tile positions.
        vm = v.reshape(r * r, tiles, c)
        mm = np.empty((r * r, tiles, o), dt)
        epilogue: list[_Step] = []
        at = _AT[m]
        if self.bias is not None:
            # A^T has a column of ones, so a value added at that tile position (p, p)
            # reaches each output of the block exactly once: the bias is one add over
            # 1/r^2 of M instead of a pass over the output.
            p = int(np.flatnonzero((at == 1).all(axis=0))[0])
            epilogue.append((np.add, (mm[p * r + p], self.bias), mm[p * r + p]))

        # Output transform, rows then columns, into a channels-last (N, th, m, tw, m, O)
        # result; one transposing copy crops it into `out`.
        mm6 = mm.reshape(r, r, n, th, tw, o)
        half = np.empty((m, r, n, th, tw, o), dt)
        epilogue += _combine_all(at, list(mm6), list(half), _scratch(at, half[0]))
        res = np.empty((n, th, m, tw, m, o), dt)
        y_cols = res.transpose(4, 2, 0, 1, 3, 5)  # [j] -> (i, n, th, tw, o)
        half_cols = half.transpose(1, 0, 2, 3, 4, 5)  # [b] -> (i, n, th, tw, o)
        epilogue += _combine_all(at, list(half_cols), list(y_cols), _scratch(at, y_cols[0]))
        back = res.reshape(n, m * th, m * tw, o)[:, :oh, :ow].transpose(0, 3, 1, 2)

        u, act = self.u, self.activation
        copyto, matmul = np.copyto, np.matmul

        def compute() -> None:
            copyto(interior, xt)
            for f, args, dst in steps:
                f(*args, out=dst)
            matmul(vm, u, out=mm)
            for f, args, dst in epilogue:
                f(*args, out=dst)
            copyto(out, back)
            if act is not None:
                act(out)

        return compute


def _scratch(mat: np.ndarray, like: np.ndarray) -> np.ndarray | None:
    """A temporary for `_combine` when `mat` has coefficients other than 0 and +-1."""
    return None if np.isin(mat, (-1, 0, 1)).all() else np.empty(like.shape, like.dtype)


def _combine_all(mat: np.ndarray, srcs: Sequence[np.ndarray], dsts: Sequence[np.ndarray],
                 scratch: np.ndarray | None) -> list[_Step]:
    """Steps computing dsts[a] = sum_k mat[a, k] * srcs[k] for every row a of `mat`."""
    steps: list[_Step] = []
    for row, dst in zip(mat, dsts, strict=True):
        steps += _combine(row, srcs, dst, scratch)
    return steps


def _combine(coefs: np.ndarray, srcs: Sequence[np.ndarray], dst: np.ndarray,
             scratch: np.ndarray | None) -> list[_Step]:
    """Steps computing dst = sum_k coefs[k] * srcs[k] with as few ufunc calls as possible.

    Coefficients of +-1 become adds and subtracts; others a multiply into `scratch`
    (same shape as dst) and an add. A first term of +1 is folded into the first add, so a
    two-term +-1 sum (all of F(2x2, 3x3)) is one call.
    """
    terms = [(float(cf), s) for cf, s in zip(coefs, srcs, strict=True) if cf != 0]
    terms.sort(key=lambda t: t[0] != 1)  # a +1 term first, when there is one
    add, sub, mul, pos = np.add, np.subtract, np.multiply, np.positive
    steps: list[_Step] = []
    first_cf, first = terms[0]
    pending = first if first_cf == 1 else None  # a +1 first term not yet written
    if pending is None:
        steps.append((mul, (first, first_cf), dst))
    for cf, src in terms[1:]:
        acc = pending if pending is not None else dst
        if cf == 1:
            steps.append((add, (acc, src), dst))
        elif cf == -1:
            steps.append((sub, (acc, src), dst))
        elif pending is not None:
            steps.append((mul, (src, cf), dst))
            steps.append((add, (dst, pending), dst))
        else:
            steps.append((mul, (src, cf), scratch))
            steps.append((add, (dst, scratch), dst))
        pending = None
    if pending is not None:  # a single +1 term: a copy
        steps.append((pos, (pending,), dst))
    return steps
