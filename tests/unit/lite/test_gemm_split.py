"""conv_common.gemm: products just above OpenBLAS's unpacked limit run in blocks."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite.kernels import conv_common, raw
from sporenet.lite.threads import BLAS


@pytest.mark.parametrize(
    "m,n,k",
    [
        (9, 1280, 160),  # a 1x1 head on a 3x3 map: split along columns
        (2352, 16, 28),  # a stem's columns: split along rows
        (193, 201, 33),  # sizes that do not divide into the blocks
        (30, 30, 30),  # under the limit: one call
        (300, 300, 300),  # over the split limit: one call
    ],
)
@pytest.mark.parametrize("transposed", [False, True])
def test_gemm_matches_matmul(m, n, k, transposed):
    rng = np.random.default_rng(m + n + k)
    a = rng.normal(size=(m, k)).astype(np.float32)
    if transposed:  # a transposed view, as the channels-last paths pass
        a = np.ascontiguousarray(a.T).T
    b = rng.normal(size=(k, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    conv_common.gemm(a, b, out)()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_gemm_writes_into_a_strided_output_view():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(9, 160)).astype(np.float32)
    b = rng.normal(size=(160, 1280)).astype(np.float32)
    full = np.zeros((1280, 9), np.float32)
    conv_common.gemm(a, b, full.T)()  # out transposed: rows of stride 4 bytes
    np.testing.assert_allclose(full.T, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def _count_products(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets an entry per BLAS product gemm makes (np.matmul, or np.dot's
    implementation, raw.dot)."""
    calls: list[int] = []
    for module, name in ((np, "matmul"), (raw, "dot")):
        real = getattr(module, name)

        def counting(*args, _real=real, **kwargs):
            calls.append(1)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    return calls


def test_gemm_splits_only_between_the_limits(monkeypatch):
    calls = _count_products(monkeypatch)

    a, b = np.ones((9, 160), np.float32), np.ones((160, 1280), np.float32)
    out = np.empty((9, 1280), np.float32)
    with BLAS.limit(1):
        conv_common.gemm(a, b, out)()
        assert len(calls) == 2  # 1.8M multiply-adds: two unpacked blocks
        calls.clear()
        small = np.ones((9, 16), np.float32)
        conv_common.gemm(a, b[:, :16], small)()
        assert len(calls) == 1


def test_gemm_keeps_one_call_while_blas_runs_several_threads(monkeypatch):
    if not BLAS.available:
        pytest.skip("no OpenBLAS whose thread count can be set")
    calls = _count_products(monkeypatch)

    rng = np.random.default_rng(1)
    a = rng.normal(size=(9, 160)).astype(np.float32)
    b = rng.normal(size=(160, 1280)).astype(np.float32)
    out = np.empty((9, 1280), np.float32)
    step = conv_common.gemm(a, b, out)
    for threads, expected in ((2, 1), (1, 2)):
        calls.clear()
        with BLAS.limit(threads):
            step()
        assert len(calls) == expected
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
