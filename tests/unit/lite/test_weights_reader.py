"""WeightsReader: read_weights for models that change only in their weights, parsed once;
and replace_weights_bytes, which writes new weights over a model's bytes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sporenet.lite import (
    InputError,
    ModelBuilder,
    ModelFormatError,
    OpCode,
    WeightsReader,
    read_weights,
    replace_weights,
    replace_weights_bytes,
    serialize,
)
from sporenet.lite.format import load
from sporenet.lite.weights import _spliced


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


# -- replace_weights_bytes: new data written over the old, the structure kept -------------


def _scalar_model() -> bytes:
    """A model with a scalar float constant and an int constant beside the matrix."""
    b = ModelBuilder()
    x = b.input("x", (-1, 4))
    w = b.constant("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    s = b.constant("s", np.array(2.0, np.float32))
    shape = b.constant("shape", np.array([-1, 3], np.int64))
    y = b.op(OpCode.FULLY_CONNECTED, [x, w])
    y = b.op(OpCode.MUL, [y, s])
    b.output(b.op(OpCode.RESHAPE, [y, shape]))
    return serialize(b.build())


@pytest.mark.parametrize("make", [_model, _scalar_model])
def test_replaced_bytes_equal_a_new_serialization(make) -> None:
    source = make()
    weights = {k: v * np.float32(-3) + np.float32(1) for k, v in read_weights(source).items()}
    want = serialize(replace_weights(source, weights))
    for given in (source, bytearray(source), memoryview(source)):
        got = replace_weights_bytes(given, weights)
        assert got == want
        _assert_same(
            {k: v for k, v in read_weights(got).items()},
            {k: _readonly(v) for k, v in weights.items()},
        )
    assert read_weights(source)["w"][0, 0] != weights["w"][0, 0]  # the source is untouched


def test_replacing_some_tensors_keeps_the_others(tmp_path) -> None:
    source = _model()
    before = read_weights(source)
    new_w = np.full_like(before["w"], 7.0)
    path = tmp_path / "m.spore"
    path.write_bytes(source)
    for given in (source, path, str(path)):
        got = read_weights(replace_weights_bytes(given, {"w": new_w}))
        np.testing.assert_array_equal(got["w"], new_w)
        np.testing.assert_array_equal(got["b"], before["b"])


def test_tensors_not_of_their_own_in_the_bytes_are_not_spliced() -> None:
    """A tensor the parser copied (a misaligned buffer), or one whose bytes another
    tensor shares, cannot be written in place: the caller serializes anew instead."""
    buf = memoryview(_model())
    model = load(buf)
    w, b = (next(i for i, t in enumerate(model.tensors) if t.name == n) for n in ("w", "b"))
    new = {w: np.zeros((3, 4), np.float32)}
    assert _spliced(buf, model, new) is not None
    copied = list(model.tensors)
    copied[w] = dataclasses.replace(copied[w], data=np.array(copied[w].data))
    assert _spliced(buf, dataclasses.replace(model, tensors=copied), new) is None
    shared = list(model.tensors)
    shared[b] = dataclasses.replace(shared[b], data=shared[w].data.reshape(-1)[:3])
    assert _spliced(buf, dataclasses.replace(model, tensors=shared), new) is None


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"nope": np.zeros(3, np.float32)}, "unknown weight tensors ['nope']"),
        (
            {"w": np.zeros((4, 3), np.float32)},
            "weight 'w': expected float32[3, 4], got float32[4, 3]",
        ),
        ({"b": np.zeros(3, np.float64)}, "weight 'b': expected float32[3], got float64[3]"),
    ],
)
def test_mismatched_weights_are_refused_by_name(weights, message) -> None:
    with pytest.raises(InputError) as e:
        replace_weights_bytes(_model(), weights)
    assert message in str(e.value)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a)
    a.flags.writeable = False
    return a
