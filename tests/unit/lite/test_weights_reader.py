"""WeightsReader: read_weights for models that change only in their weights, parsed once."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import (
    ModelBuilder,
    ModelFormatError,
    OpCode,
    WeightsReader,
    read_weights,
    replace_weights_bytes,
    serialize,
)


def _model(rows: int = 3, cols: int = 4, weight_name: str = "w", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, cols))
    w = b.constant(weight_name, rng.standard_normal((rows, cols)).astype(np.float32))
    bias = b.constant("b", rng.standard_normal(rows).astype(np.float32))
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, w, bias]))
    return serialize(b.build())


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape
        np.testing.assert_array_equal(got[name], value)
        assert not got[name].flags.writeable


def test_a_model_with_new_weights_reuses_the_layout_and_reads_them() -> None:
    first = _model()
    reader = WeightsReader()
    _assert_same(reader.read(first), read_weights(first))
    for step in range(1, 4):
        weights = {k: v + np.float32(step) for k, v in read_weights(first).items()}
        later = bytearray(replace_weights_bytes(first, weights))  # as a client's buffer holds it
        _assert_same(reader.read(later), read_weights(bytes(later)))
    assert reader.full_parses == 1


def test_a_model_with_another_structure_is_parsed_in_full() -> None:
    reader = WeightsReader()
    reader.read(_model())
    for other in (_model(rows=5), _model(weight_name="v")):  # new shapes; a renamed tensor
        _assert_same(reader.read(other), read_weights(other))
    assert reader.full_parses == 3


def test_a_corrupt_model_of_the_same_size_is_refused_and_the_reader_goes_on() -> None:
    good = _model()
    reader = WeightsReader()
    reader.read(good)
    corrupt = bytearray(good)
    corrupt[4:8] = b"XXXX"  # the file identifier lies outside the tensors' data
    with pytest.raises(ModelFormatError, match="file identifier"):
        reader.read(corrupt)
    _assert_same(reader.read(good), read_weights(good))
