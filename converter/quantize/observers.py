"""Range observers: what calibration learns about each float tensor, and the range it picks.

MinMax keeps the extremes. Percentile and entropy keep a histogram of |x| (2048 bins over
[0, max |x|], re-binned when a later batch reaches further) and clip the range: percentile
at the given share of values, entropy at the threshold whose int8 histogram has the least
KL divergence from the float one (the TensorRT calibration that onnxruntime also uses).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np


class Method(StrEnum):
    """How calibration turns observed values into a quantization range."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"


HISTOGRAM_BINS = 2048
DEFAULT_PERCENTILE = 99.999


class MinMaxObserver:
    """Running minimum and maximum of every value seen."""

    def __init__(self) -> None:
        self.min = np.inf
        self.max = -np.inf

    def update(self, x: np.ndarray) -> None:
        if x.size:
            self.min = min(self.min, float(x.min()))
            self.max = max(self.max, float(x.max()))

    @property
    def seen(self) -> bool:
        return self.min <= self.max

    def range(self) -> tuple[float, float]:
        return self.min, self.max


class HistogramObserver(MinMaxObserver):
    """MinMax plus a histogram of |x| for the clipping methods."""

    def __init__(
        self, method: Method, *, percentile: float = DEFAULT_PERCENTILE, bins: int = HISTOGRAM_BINS
    ) -> None:
        super().__init__()
        self.method = method
        self.percentile = percentile
        self.counts = np.zeros(bins, np.int64)
        self.top = 0.0  # upper edge of the last bin

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        super().update(x)
        a = np.abs(x.astype(np.float32, copy=False)).ravel()
        peak = float(a.max())
        if peak > self.top:
            self._widen(peak)
        if self.top > 0:
            counts, _ = np.histogram(a, bins=self.counts.size, range=(0.0, self.top))
            self.counts += counts
        else:
            self.counts[0] += a.size

    def _widen(self, peak: float) -> None:
        """Re-bin what was seen onto [0, peak]: old bins move by their centres."""
        bins = self.counts.size
        if self.top > 0 and self.counts.any():
            centres = (np.arange(bins) + 0.5) * (self.top / bins)
            self.counts, _ = np.histogram(
                centres, bins=bins, range=(0.0, peak), weights=self.counts
            )
            self.counts = np.rint(self.counts).astype(np.int64)
        self.top = peak

    def threshold(self) -> float:
        if self.top == 0:
            return 0.0
        if self.method == Method.PERCENTILE:
            return percentile_threshold(self.counts, self.top, self.percentile)
        levels = 256 if self.min >= 0 else 128  # magnitudes one sign gets in 8 bits
        return entropy_threshold(self.counts, self.top, levels)

    def range(self) -> tuple[float, float]:
        t = self.threshold()
        return max(self.min, -t), min(self.max, t)


def percentile_threshold(counts: np.ndarray, top: float, percentile: float) -> float:
    """The upper edge of the first bin where the cumulative share reaches `percentile`."""
    cdf = np.cumsum(counts) / max(int(counts.sum()), 1)
    index = int(np.searchsorted(cdf, percentile / 100.0))
    return top * min(index + 1, counts.size) / counts.size


def entropy_threshold(counts: np.ndarray, top: float, levels: int = 128) -> float:
    """TensorRT's KL calibration: for each candidate threshold (in bins, from `levels` up),
    the clipped reference distribution P (outliers folded into its last bin) is compared
    with Q, P merged into `levels` buckets and spread back over its nonzero bins; the
    threshold with the smallest KL(P || Q) wins."""
    bins = counts.size
    if bins <= levels:
        return top
    hist = counts.astype(np.float64)
    tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    best, best_i = np.inf, bins
    for i in range(levels, bins + 1):
        p = hist[:i].copy()
        p[-1] += tail[i]
        nonzero = hist[:i] != 0
        edges = (np.arange(levels) * i) // levels
        sums = np.add.reduceat(hist[:i], edges)
        used = np.add.reduceat(nonzero.astype(np.float64), edges)
        group = np.repeat(np.arange(levels), np.diff(np.append(edges, i)))
        q = np.where(nonzero, (sums / np.maximum(used, 1))[group], 0.0)
        ps, qs = p.sum(), q.sum()
        if ps == 0 or qs == 0:
            continue
        p /= ps
        q /= qs
        mask = p > 0
        if np.any(q[mask] == 0):
            continue
        kl = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if kl < best:
            best, best_i = kl, i
    return top * best_i / bins


def make_observer(method: Method) -> MinMaxObserver:
    """The observer calibration keeps for one tensor under `method`."""
    if method == Method.MINMAX:
        return MinMaxObserver()
    return HistogramObserver(method)
