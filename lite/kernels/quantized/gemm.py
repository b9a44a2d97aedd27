"""Integer products through float BLAS, exact by construction.

NumPy has no int8 GEMM. A float32 GEMM returns the exact integer result when every
partial sum it forms is an integer below 2^24 in magnitude, whatever order BLAS adds in:
that holds when max|x| * max over outputs of sum|w| < 2^24, a bound known at plan time
for constant weights. Otherwise the product runs in float64 (exact below 2^53, which
int32 accumulators never reach for reductions shorter than 2^22 elements).
"""

from __future__ import annotations

import bisect

import numpy as np

from sporenet.lite.kernels.quantized.fixed_point import INT_RANGES

FLOAT32_EXACT = 1 << 24
FLOAT64_EXACT = 1 << 53


def max_abs_shifted(dtype: np.dtype, zero_point: int) -> int:
    """Largest |q - zero_point| over the dtype's range."""
    lo, hi = INT_RANGES[np.dtype(dtype)]
    return max(zero_point - lo, hi - zero_point)


def exact_float_dtype(bound: int) -> np.dtype:
    """float32 when every partial sum is below `bound` < 2^24, else float64."""
    if bound < FLOAT32_EXACT:
        return np.dtype(np.float32)
    if bound >= FLOAT64_EXACT:
        raise OverflowError(f"integer products up to {bound} exceed float64's exact range")
    return np.dtype(np.float64)


_BLOCK = 16  # rows or columns per step: planning never holds a wide copy of the weights


def _abs(block: np.ndarray) -> np.ndarray:
    """|block| as float64 (exact integers: sums of 8-bit weights stay far below 2^53).
    Float64, not int32: the loops of float64 arithmetic are code every plan runs anyway,
    integer abs and max reductions are code of their own for the process to fault in."""
    return np.abs(block.astype(np.float64))


def weight_bound(x_max: int, w: np.ndarray, reduce_axes: tuple[int, ...]) -> int:
    """max|x| times the largest sum of |w| over the reduction axes (one output's terms).
    The reduction axes are all but axis 0 (the output channel)."""
    del reduce_axes  # always every axis after the first (checked by the callers' shapes)
    w2 = w.reshape(w.shape[0], -1)
    best = 0
    for start in range(0, w2.shape[0], _BLOCK):
        sums = _abs(w2[start : start + _BLOCK]).sum(axis=1)
        best = max(best, int(sums.max(initial=0)))
    return int(x_max) * best


def split_reduction(x_max: int, w: np.ndarray) -> list[tuple[int, int]]:
    """Split the reduction axis (axis 1 of w seen as (O, K)) into ranges whose float32
    partial sums stay exact: x_max * max over outputs of sum |w| over the range < 2^24."""
    w2 = w.reshape(w.shape[0], -1)
    k = w2.shape[1]
    limit = (FLOAT32_EXACT - 1) // max(int(x_max), 1)
    ranges, start = [], 0
    running = np.zeros(w2.shape[0], np.float64)  # sum |w| over [start, col) per output
    for a in range(0, k, _BLOCK):
        b = min(a + _BLOCK, k)
        block = _abs(w2[:, a:b])
        col = a
        while col < b:
            cums = running[:, None] + np.cumsum(block[:, col - a :], axis=1)
            fit = bisect.bisect_right(cums.max(axis=0).tolist(), limit)
            if fit == b - col:
                running, col = cums[:, -1], b
                continue
            end = col + fit
            if end == start:
                raise OverflowError("a single product exceeds float32's exact range")
            ranges.append((start, end))
            start, col = end, end
            running = np.zeros_like(running)
    if start < k:
        ranges.append((start, k))
    return ranges
