"""Range observers: what calibration learns about each float tensor, and the range it picks.

MinMax keeps the extremes. Percentile and entropy keep a 2048-bin histogram (re-binned
when a later batch reaches further) and clip the range. Percentile: a histogram of |x|,
clipped where the given share of values lies below. Entropy: a histogram of x over
[-max |x|, max |x|]; each window symmetric around zero, from 128 bins wide to the whole
histogram, is compared with its 128-level quantization (outliers folded into its end
bins, both smoothed) and the window with the least KL divergence wins: TensorRT's
calibration in the symmetric form onnxruntime's entropy calibrator uses.
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
    """MinMax plus a histogram for the clipping methods: of |x| over [0, top] for
    percentile, of x over [-top, top] for entropy."""

    def __init__(
        self, method: Method, *, percentile: float = DEFAULT_PERCENTILE, bins: int = HISTOGRAM_BINS
    ) -> None:
        super().__init__()
        self.method = method
        self.percentile = percentile
        self.signed = method == Method.ENTROPY
        self.counts = np.zeros(bins, np.int64)
        self.top = 0.0  # the histogram spans [0, top], or [-top, top] when signed

    def _span(self, top: float) -> tuple[float, float]:
        return (-top if self.signed else 0.0), top

    def update(self, x: np.ndarray) -> None:
        if not x.size:
            return
        super().update(x)
        values = x.astype(np.float32, copy=False).ravel()
        if not self.signed:
            values = np.abs(values)
        peak = float(np.abs(values).max())
        if peak > self.top:
            self._widen(peak)
        if self.top > 0:
            counts, _ = np.histogram(values, bins=self.counts.size, range=self._span(self.top))
            self.counts += counts
        else:
            self.counts[self.counts.size // 2 if self.signed else 0] += values.size

    def _widen(self, peak: float) -> None:
        """Re-bin what was seen onto the wider span: old bins move by their centres."""
        bins = self.counts.size
        if self.top > 0 and self.counts.any():
            lo, hi = self._span(self.top)
            centres = lo + (np.arange(bins) + 0.5) * ((hi - lo) / bins)
            counts, _ = np.histogram(
                centres, bins=bins, range=self._span(peak), weights=self.counts
            )
            self.counts = np.rint(counts).astype(np.int64)
        self.top = peak

    def range(self) -> tuple[float, float]:
        if self.top == 0:
            return self.min, self.max
        if self.method == Method.PERCENTILE:
            t = percentile_threshold(self.counts, self.top, self.percentile)
        else:
            t = entropy_threshold(self.counts, self.top)
        return max(self.min, -t), min(self.max, t)


def percentile_threshold(counts: np.ndarray, top: float, percentile: float) -> float:
    """The upper edge of the first bin where the cumulative share reaches `percentile`."""
    cdf = np.cumsum(counts) / max(int(counts.sum()), 1)
    index = int(np.searchsorted(cdf, percentile / 100.0))
    return top * min(index + 1, counts.size) / counts.size


def _smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """Move eps of mass onto every empty bin (taken evenly from the others), so KL stays
    finite; None when every bin is empty."""
    zeros = p == 0
    nonzero = p.size - int(zeros.sum())
    if nonzero == 0:
        return None
    return p + eps * zeros - (eps * zeros.sum() / nonzero) * ~zeros


def entropy_threshold(counts: np.ndarray, top: float, levels: int = 128) -> float:
    """The half-width of the window of a signed histogram over [-top, top] whose
    `levels`-level quantization has the least KL divergence from it."""
    bins = counts.size
    hist = counts.astype(np.float64)
    centre, half = bins // 2, levels // 2
    cumulative = np.concatenate([[0.0], np.cumsum(hist)])
    best, best_i = np.inf, centre
    for i in range(half, centre + 1):
        start, end = centre - i, min(centre + i + 1, bins)
        window = hist[start:end]
        p = window.copy()
        p[0] += cumulative[start]
        p[-1] += cumulative[bins] - cumulative[end]
        nonzero = p != 0
        merged = window.size // levels
        edges = np.arange(levels) * merged
        sums = np.add.reduceat(window[: levels * merged], edges)
        sums[-1] += window[levels * merged :].sum()
        used = np.add.reduceat(nonzero[: levels * merged].astype(np.float64), edges)
        q = np.zeros(window.size)
        # Each level's count is spread over its bins as whole numbers, as onnxruntime
        # does: sparse tails quantize to nothing, which is what makes clipping them pay.
        q[: levels * merged] = np.repeat(
            np.floor(np.divide(sums, used, out=np.zeros(levels), where=used > 0)), merged
        )
        ps, qs = _smooth(p), _smooth(q)
        if ps is None or qs is None:
            continue
        ps, qs = ps / ps.sum(), qs / qs.sum()
        mask = ps > 0
        kl = float(np.sum(ps[mask] * np.log(ps[mask] / np.maximum(qs[mask], 1e-300))))
        if kl < best:
            best, best_i = kl, i
    return top * min(best_i + 1, centre) / centre


def make_observer(method: Method) -> MinMaxObserver:
    """The observer calibration keeps for one tensor under `method`."""
    if method == Method.MINMAX:
        return MinMaxObserver()
    return HistogramObserver(method)
