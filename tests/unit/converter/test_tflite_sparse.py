"""Expanding TFLite's sparse tensors (CSR levels, blocks) to dense arrays."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter.tflite_import.sparse import Level, SparseFormatError, Sparsity, densify


def test_csr_matrix():
    dense = np.array([[1, 0, 2, 0], [0, 0, 0, 0], [0, 3, 0, 4]], np.float32)
    sparsity = Sparsity(
        [0, 1], [], [Level(3), Level(0, np.array([0, 2, 2, 4]), np.array([0, 2, 1, 3]))]
    )
    got = densify(np.array([1, 2, 3, 4], np.float32), dense.shape, sparsity)
    np.testing.assert_array_equal(got, dense)


def test_block_sparse_matrix():
    # 4x4 in 2x2 blocks; blocks (0, 0) and (1, 1) are stored, each in row-major order.
    dense = np.zeros((4, 4), np.float16)
    dense[:2, :2] = [[1, 2], [3, 4]]
    dense[2:, 2:] = [[5, 6], [7, 8]]
    sparsity = Sparsity(
        [0, 1, 2, 3],
        [0, 1],
        [Level(2), Level(0, np.array([0, 1, 2]), np.array([0, 1])), Level(2), Level(2)],
    )
    got = densify(np.arange(1, 9, dtype=np.float16), dense.shape, sparsity)
    np.testing.assert_array_equal(got, dense)


@pytest.mark.parametrize(
    ("segments", "indices", "values", "match"),
    [
        ([0, 2, 2, 4], [0, 2, 1, 9], 4, "indices outside"),
        ([0, 3, 2, 4], [0, 2, 1, 3], 4, "not increasing"),
        ([0, 2, 2, 4], [0, 2, 1, 3], 3, "stored values"),
        ([0, 2], [0, 2], 2, "segments"),
    ],
)
def test_malformed_parameters_are_refused(segments, indices, values, match):
    sparsity = Sparsity([0, 1], [], [Level(3), Level(0, np.array(segments), np.array(indices))])
    with pytest.raises(SparseFormatError, match=match):
        densify(np.ones(values, np.float32), (3, 4), sparsity)
