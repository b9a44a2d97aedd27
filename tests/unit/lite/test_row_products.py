"""Products of 2 or 3 rows over weights beyond L2's run as one matrix-vector product per
row (faster than OpenBLAS's GEMM there, conv_common.row_products): a recurrent step's stacked state
times its weights (recurrent_fast.bind_product), for whole weights and for a column slice
of them (a GRU's z and r gates), and FullyConnected; equal to the float64 product at every
row count, for weights small enough for one GEMM and large enough for the rows."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.eager import run_op
from sporenet.lite.kernels.conv_common import row_products
from sporenet.lite.kernels.recurrent_fast import bind_product
from sporenet.lite.ops import OpCode

RNG = np.random.default_rng(3)


SIZES = {"small": (24, 36), "large": (256, 768)}  # (in, out): one GEMM, row by row


def test_large_weights_take_row_products() -> None:
    for rows in (2, 3):
        assert not row_products(rows, *SIZES["small"])
        assert row_products(rows, *SIZES["large"])
        assert row_products(rows, *SIZES["large"][::-1])
    assert not row_products(1, *SIZES["large"]) and not row_products(4, *SIZES["large"])


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("dirs", [1, 2])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "column-slice"])
@pytest.mark.parametrize("size", sorted(SIZES))
def test_product_equals_matmul(rows: int, dirs: int, sliced: bool, size: str) -> None:
    k, n = SIZES[size]
    x = RNG.standard_normal((dirs, rows, k)).astype(np.float32)
    w = RNG.standard_normal((dirs, k, n)).astype(np.float32)
    out = np.full((dirs, rows, n), np.nan, np.float32)
    if sliced:
        w, out = w[..., : 2 * n // 3], out[..., : 2 * n // 3]
    step = bind_product(x, w, out)
    for _ in range(2):  # the bound views keep working when the state changes
        x[...] = RNG.standard_normal(x.shape)
        step()
        want = np.matmul(x.astype(np.float64), w.astype(np.float64))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("size", sorted(SIZES))
def test_fully_connected_equals_the_float64_product(rows: int, bias: bool, size: str) -> None:
    k, n = SIZES[size]
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = RNG.standard_normal((n, k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    (got,) = run_op(OpCode.FULLY_CONNECTED, [x, w, b] if bias else [x, w], activation="relu")
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-5, atol=1e-5)
