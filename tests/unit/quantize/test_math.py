"""Calibration observers and quantization parameters against direct NumPy computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.converter.quantize import params as P
from sporenet.converter.quantize.observers import (
    HistogramObserver,
    Method,
    MinMaxObserver,
    entropy_threshold,
    percentile_threshold,
)


def test_minmax_tracks_extremes_over_batches() -> None:
    obs = MinMaxObserver()
    obs.update(np.array([1.0, -2.0]))
    obs.update(np.array([0.5, 3.0]))
    assert obs.range() == (-2.0, 3.0)


def test_percentile_clips_the_tail() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 100_000)
    obs = HistogramObserver(Method.PERCENTILE, percentile=99.0)
    obs.update(x[:50_000])
    obs.update(x[50_000:] * 2)  # widens the histogram: old counts move to the new bins
    lo, hi = obs.range()
    want = np.percentile(np.concatenate([x[:50_000], x[50_000:] * 2]), 99.0)
    assert lo == min(x[:50_000].min(), 2 * x[50_000:].min())
    assert abs(hi - want) < 2 * 2.0 / 2048 + 0.01


def test_percentile_threshold_on_a_known_histogram() -> None:
    counts = np.zeros(100, np.int64)
    counts[:10] = 10  # 100 values in the first ten bins
    assert percentile_threshold(counts, 100.0, 50.0) == 5.0


def test_entropy_clips_rare_outliers() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200_000), [60.0, -55.0]])
    obs = HistogramObserver(Method.ENTROPY)
    obs.update(x[:100_000])
    obs.update(x[100_000:])  # the outliers widen the histogram
    lo, hi = obs.range()
    assert 3.0 < hi < 20.0 and -20.0 < lo < -3.0  # far inside the outliers at +-60


@pytest.mark.parametrize("seed", [0, 1])
def test_entropy_threshold_is_onnxruntimes(seed: int) -> None:
    """The same window as onnxruntime's entropy calibrator on the same histogram."""
    calibrate = pytest.importorskip("onnxruntime.quantization.calibrate", reason="test extra")
    rng = np.random.default_rng(seed)
    x = [
        rng.standard_normal(50_000) ** 3,
        np.maximum(rng.standard_normal(50_000), 0),
        rng.laplace(size=50_000),
    ][seed].astype(np.float32)
    top = float(np.abs(x).max())
    counts, edges = np.histogram(x, 2048, range=(-top, top))
    collector = calibrate.HistogramCollector("entropy", False, 2048, 128, 99.999, "same")
    lo, hi = collector.get_entropy_threshold((counts, edges, x.min(), x.max(), top), 128)
    t = entropy_threshold(counts, top)
    step = 2 * top / 2048
    assert abs(t - float(hi)) <= step or float(hi) == float(x.max())
    assert abs(-t - float(lo)) <= step or float(lo) == float(x.min())


@settings(max_examples=60, deadline=None)
@given(st.floats(-50, 0), st.floats(0, 50), st.sampled_from(["int8", "uint8"]))
def test_activation_params_cover_the_range_with_exact_zero(
    lo: float, hi: float, dtype: str
) -> None:
    q = P.activation_params(lo, hi, np.dtype(dtype))
    scale, zp = float(q.scale[0]), int(q.zero_point[0])
    qmin, qmax = P.INT_RANGES[np.dtype(dtype)]
    assert qmin <= zp <= qmax
    x = np.linspace(lo, hi, 101, dtype=np.float32)
    back = P.dequantize(P.quantize(x, q, np.dtype(dtype)), q)
    if hi > lo:
        assert np.max(np.abs(back - x)) <= scale * 0.5 + scale * 1e-3
    assert P.dequantize(P.quantize(np.zeros(1, np.float32), q, np.dtype(dtype)), q)[0] == 0


def test_per_channel_weights_are_symmetric_and_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    w = (
        rng.normal(0, 1, (4, 3, 3, 3)).astype(np.float32)
        * np.array([1, 10, 0.1, 0])[:, None, None, None]
    )
    values, q = P.quantize_weights(w, axis=0)
    assert values.dtype == np.int8 and values.min() >= -127 and values.max() <= 127
    assert q.zero_point.size == 0  # symmetric: no zero points stored
    np.testing.assert_allclose(q.scale[:3], np.abs(w[:3]).max(axis=(1, 2, 3)) / 127, rtol=1e-6)
    assert q.scale[3] == 1.0  # an all-zero channel
    err = np.abs(P.dequantize(values, q) - w).max(axis=(1, 2, 3))
    assert np.all(err <= q.scale * 0.5 + 1e-7)
    per_tensor_values, qt = P.quantize_weights(w, axis=None)
    assert qt.scale.size == 1 and np.abs(per_tensor_values).max() == 127


def test_bias_scale_is_input_times_weight_scale() -> None:
    wq = P.weight_params(np.array([[1.27], [0.254]], np.float32), 0)
    b, bq = P.quantize_bias(np.array([0.5, -0.25], np.float32), 0.02, wq)
    np.testing.assert_allclose(bq.scale, 0.02 * wq.scale, rtol=1e-6)
    assert b.dtype == np.int32
    np.testing.assert_array_equal(b, np.rint(np.array([0.5, -0.25]) / (0.02 * wq.scale)))


def test_sqnr() -> None:
    x = np.ones(100)
    assert P.sqnr_db(x, x) == float("inf")
    assert abs(P.sqnr_db(x, x * 1.1) - 20.0) < 1e-9


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16])
def test_dequantize_in_float32_equals_the_float64_formula(dtype) -> None:
    # The float32 path (no float64 copy of the weights) must round exactly as the float64
    # product rounded to float32, per tensor and per channel.
    from sporenet.lite.graph import Quantization

    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    q_values = rng.integers(info.min, info.max + 1, size=(4, 3, 5)).astype(dtype)
    for scale, zp, axis in (
        (np.float32([0.0123]), np.array([int(info.min) // 2]), 0),
        (rng.uniform(1e-3, 2, 3).astype(np.float32), rng.integers(info.min, info.max, 3), 1),
    ):
        q = Quantization(scale=scale, zero_point=zp, axis=axis)
        shape = [1, 1, 1]
        shape[axis] = scale.size
        want = (q_values.astype(np.float64) - zp.reshape(shape)) * scale.astype(np.float64).reshape(
            shape
        )
        got = P.dequantize(q_values, q)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(np.float32))
