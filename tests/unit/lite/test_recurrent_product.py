"""recurrent_fast.bind_product: a step's stacked state times its weights, one product per
row for 2 or 3 rows (faster than OpenBLAS's GEMM there), equal to np.matmul at every
row count, for whole weights and for a column slice of them (a GRU's z and r gates)."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels.recurrent_fast import bind_product

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("dirs", [1, 2])
@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "column-slice"])
def test_product_equals_matmul(rows: int, dirs: int, sliced: bool) -> None:
    k, n = 24, 36
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
