"""The 2-D product steps (conv_common.gemm, matmul_for): np.dot where it applies, the
same products as np.matmul everywhere, split into blocks or not."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels.conv_common import UNPACKED_GEMM, gemm, matmul_for
from sporenet.lite.threads import BLAS


@pytest.mark.parametrize(
    "m,k,n",
    [(1, 32, 1), (16, 28, 16384), (16384, 28, 16), (3, 5, 7), (64, 700, 64)],
    ids=["one-column", "column-blocks", "row-blocks", "small", "large"],
)
def test_gemm_matches_float64_in_place(m, k, n):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(m, k)).astype(np.float32)
    b = rng.normal(size=(n, k)).astype(np.float32).T  # a transposed operand, as BLAS reads
    out = np.full((m, n), np.nan, np.float32)
    with BLAS.limit(1):  # blocks run only on one BLAS thread
        gemm(a, b, out)()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


def test_the_block_cases_split():
    # gemm splits products between OpenBLAS's unpacked limit and 8x it into blocks.
    assert UNPACKED_GEMM < 16 * 28 * 16384 <= 8 * UNPACKED_GEMM


def test_matmul_for_takes_dot_only_for_contiguous_separate_outputs():
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    assert matmul_for(a, b, np.empty((4, 5), np.float32)) is np.dot
    assert matmul_for(a, b, np.empty((4, 10), np.float32)[:, :5]) is np.matmul
    assert matmul_for(a, b, np.empty((4, 5), np.float64)) is np.matmul
    assert matmul_for(a[None], b, np.empty((1, 4, 5), np.float32)) is np.matmul
    square = np.ones((4, 4), np.float32)
    assert matmul_for(square, square, square) is np.matmul
