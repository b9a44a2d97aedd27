"""lite.huge_pages: large arrays start on a 2 MiB boundary, small ones are plain."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import huge_pages
from sporenet.lite.graph import Quantization
from sporenet.lite.kernels.recurrent_fast import pack_transposed


def test_large_arrays_start_on_a_huge_page_and_hold_their_shape():
    for shape, dtype in (((2, 512, 2048), np.float32), ((3, 1 << 20), np.float64)):
        a = huge_pages.empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.ctypes.data % huge_pages.HUGE_PAGE == 0
        a[...] = 1.5  # writable over its whole extent
        assert float(a.sum()) == 1.5 * a.size


def test_small_arrays_are_ordinary():
    a = huge_pages.empty((100, 100), np.float32)
    assert a.shape == (100, 100) and a.base is None


def test_lstm_recurrent_weights_are_packed_on_a_huge_page():
    # An 8 MiB int8-quantized R, dequantized into its packed (dirs, H, 4H) float32 form.
    rng = np.random.default_rng(0)
    r = rng.integers(-128, 128, size=(2, 2048, 512)).astype(np.int8)
    quant = Quantization(scale=np.array([0.01], np.float32), zero_point=np.array([0], np.int64))
    packed = pack_transposed(r, quant, np.ones(2048, np.float32), np.dtype(np.float32))
    assert packed.ctypes.data % huge_pages.HUGE_PAGE == 0
    np.testing.assert_array_equal(packed[1], r[1].T.astype(np.float32) * np.float32(0.01))


def _resident_bytes(lo: int, hi: int) -> int | None:
    """Resident bytes of the mappings that overlap [lo, hi), from /proc/self/smaps."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(v, 16) for v in head.split("-"))
            inside = start < hi and end > lo
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_the_partial_region_after_the_whole_huge_pages_stays_small_paged():
    """A 9.4 MiB array written whole holds its own pages only: its last, partial 2 MiB
    region is not rounded up to a huge page (NumPy's own advice covers it)."""
    a = huge_pages.empty((768, 3072), np.float32)  # 4.5 huge pages
    a[...] = 1
    resident = _resident_bytes(a.ctypes.data, a.ctypes.data + a.nbytes)
    if resident is None:
        pytest.skip("no /proc/self/smaps")
    # A huge page over the 1 MiB tail would add 1 MiB; a mapping the kernel merged with
    # a neighbour's adds that neighbour's few pages.
    assert a.nbytes <= resident < a.nbytes + (256 << 10)
