"""The 2-D product steps (conv_common.gemm, matmul_for, a fully connected layer's few
rows): np.dot where it applies, the same products as np.matmul everywhere, split into
blocks or not, transposed or not."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.eager import prepare_kernel
from sporenet.lite.kernels import raw
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.kernels.conv_common import UNPACKED_GEMM, gemm, matmul_for
from sporenet.lite.ops import OpCode
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
    assert matmul_for(a, b, np.empty((4, 5), np.float32)) is raw.dot  # np.dot, undispatched
    assert matmul_for(a, b, np.empty((4, 10), np.float32)[:, :5]) is np.matmul
    assert matmul_for(a, b, np.empty((4, 5), np.float64)) is np.matmul
    assert matmul_for(a[None], b, np.empty((1, 4, 5), np.float32)) is np.matmul
    square = np.ones((4, 4), np.float32)
    assert matmul_for(square, square, square) is np.matmul


def test_matmul_for_takes_matmul_for_large_outputs():
    # np.dot clears its output before the product: a large output takes np.matmul.
    a, b = np.ones((1024, 16), np.float32), np.ones((16, 64), np.float32)
    assert matmul_for(a, b, np.empty((1024, 64), np.float32)) is np.matmul
    assert matmul_for(a[:8], b, np.empty((8, 64), np.float32)) is raw.dot


@pytest.mark.parametrize(
    "rows,transposed", [(1, False), (5, True), (48, True), (64, False)], ids=str
)
def test_fully_connected_with_few_rows_matches_float64(rows, transposed):
    # A few rows run as (W @ x.T).T; one row (a matrix-vector product) and many rows as
    # x @ W.T. Either way the bias and the fused activation follow the product.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(rows, 1, 224)).astype(np.float32)
    w, bias = rng.normal(size=(256, 224)).astype(np.float32), rng.normal(size=256)
    bias = bias.astype(np.float32)
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(w.shape, w.dtype, w)]
    specs.append(TensorSpec(bias.shape, bias.dtype, bias))
    kernel = prepare_kernel(OpCode.FULLY_CONNECTED, {"activation": "relu"}, specs, 1)
    assert kernel.transposed == transposed
    out = np.full((rows, 1, 256), np.nan, np.float32)
    kernel.bind([x, w, bias], [out])()
    want = np.maximum(x.astype(np.float64) @ w.T.astype(np.float64) + bias, 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("outputs", [1, 64])
def test_fully_connected_one_row_adds_its_bias_as_the_float32_formula(outputs):
    # One row: the bias is read shaped like the row, and a single output is written out
    # of place; the values are the same product plus the bias, rounded once.
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 64)).astype(np.float32)
    w = rng.normal(size=(outputs, 64)).astype(np.float32)
    bias = rng.normal(size=outputs).astype(np.float32)
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(w.shape, w.dtype, w)]
    specs.append(TensorSpec(bias.shape, bias.dtype, bias))
    kernel = prepare_kernel(OpCode.FULLY_CONNECTED, {}, specs, 1)
    out = np.full((1, outputs), np.nan, np.float32)
    kernel.bind([x, w, bias], [out])()
    np.testing.assert_array_equal(out, np.dot(x, w.T) + bias)
