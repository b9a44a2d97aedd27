"""Integer products through float BLAS, exact by construction.

NumPy has no int8 GEMM. A float32 GEMM returns the exact integer result when every
partial sum it forms is an integer below 2^24 in magnitude, whatever order BLAS adds in:
that holds when max|x| * max over outputs of sum|w| < 2^24, a bound known at plan time
for constant weights. Otherwise the product runs in float64 (exact below 2^53, which
int32 accumulators never reach for reductions shorter than 2^22 elements).
"""

from __future__ import annotations

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


def weight_bound(x_max: int, w: np.ndarray, reduce_axes: tuple[int, ...]) -> int:
    """max|x| times the largest sum of |w| over the reduction axes (one output's terms)."""
    sums = np.abs(w.astype(np.int64)).sum(axis=reduce_axes)
    return int(x_max) * int(sums.max(initial=0))
