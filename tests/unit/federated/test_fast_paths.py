"""The hand-written fast paths agree with the straightforward code they replace."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from sporenet.federated.aggregation import FOLD_BLOCK, WeightedMeanAggregator, template_of
from sporenet.federated.common import codec
from sporenet.federated.common.codec import decode_update, encode_raw, encode_update
from sporenet.federated.errors import AggregationError, UpdateRejectedError
from sporenet.federated.server.checkpoint import load_arrays, save_arrays
from sporenet.federated.server.config import build_config
from sporenet.federated.server.observability import Metrics
from sporenet.federated.server.rounds import RoundManager
from sporenet.federated.server.validation import validate_update
from sporenet.lite import InputError, read_weights, replace_weights_bytes
from sporenet.proto import federated_pb2 as pb
from tests.integration.federated.helpers import make_model

RNG = np.random.default_rng(3)
UPDATE = {
    "w": RNG.standard_normal((7, 300)).astype(np.float32),
    "scalar": np.array(2.5, np.float32),
    "empty": np.zeros((0, 4), np.float32),
    "d": RNG.standard_normal(1000),
    "big": RNG.standard_normal(FOLD_BLOCK + 17).astype(np.float32),
}


def _protobuf(update: dict[str, np.ndarray]) -> bytes:
    bundle = pb.TensorBundle()
    for name, a in update.items():
        bundle.tensors.add(name=name, dtype=a.dtype.name, shape=list(a.shape), data=a.tobytes())
    return bundle.SerializeToString()


def test_encode_raw_is_byte_for_byte_protobuf() -> None:
    assert bytes(encode_raw(UPDATE)) == _protobuf(UPDATE)
    assert encode_update(UPDATE) == _protobuf(UPDATE)


def test_encode_raw_with_base_writes_the_delta_in_the_base_dtype() -> None:
    base = {k: np.full_like(v, 0.25) for k, v in UPDATE.items()}
    trained = {k: v.astype(np.float64) for k, v in UPDATE.items()}  # cast into base's dtype
    got = decode_update(bytes(encode_raw(trained, base)), template_of(base))
    for k, v in UPDATE.items():
        expected = (v.astype(np.float64) - base[k]).astype(v.dtype)
        np.testing.assert_array_equal(got[k], expected)
        assert got[k].dtype == v.dtype and got[k].shape == v.shape


def _parsed(payload: bytes, template: dict) -> dict[str, np.ndarray]:
    """decode_update by the wire-format parser alone: the template's cached layout is
    replaced by an empty template's, which only an empty payload matches."""
    kept = dict(codec._LAYOUTS)
    codec._LAYOUTS.clear()
    codec._LAYOUTS[id(template)] = (template, codec._RawLayout({}))
    try:
        return decode_update(payload, template)
    finally:
        codec._LAYOUTS.clear()
        codec._LAYOUTS.update(kept)


def test_layout_fast_path_cuts_what_the_parser_finds() -> None:
    template = template_of(UPDATE)
    payload = bytes(encode_raw(UPDATE))
    assert codec._raw_layout(template).cut(payload) is not None  # the fast path is taken
    fast, parsed = decode_update(payload, template), _parsed(payload, template)
    assert list(fast) == list(parsed)
    for k, v in parsed.items():
        np.testing.assert_array_equal(fast[k], v)
        assert fast[k].dtype == v.dtype and fast[k].shape == v.shape


@pytest.mark.parametrize(
    "change",
    ["reordered", "extra field", "other shape", "truncated", "padded", "int8"],
)
def test_payloads_off_the_layout_take_the_parser(change: str) -> None:
    """Any byte off the canonical layout falls back to the parser: same tensors or the
    same refusal as without the fast path."""
    template = template_of(UPDATE)
    payload = bytes(encode_raw(UPDATE))
    if change == "reordered":
        payload = bytes(encode_raw(dict(reversed(list(UPDATE.items())))))
    elif change == "extra field":
        payload = payload + b"\x10\x01"  # an unknown varint field of the bundle: skipped
    elif change == "other shape":
        payload = bytes(encode_raw({**UPDATE, "w": UPDATE["w"].reshape(300, 7)}))
    elif change == "truncated":
        payload = payload[:-1]
    elif change == "padded":
        payload = payload + b"\x00"
    else:
        payload = encode_update(UPDATE, compression=["int8"])
    assert codec._raw_layout(template).cut(payload) is None
    try:
        expected = _parsed(payload, template)
    except UpdateRejectedError as e:
        with pytest.raises(UpdateRejectedError, match=re.escape(str(e))):
            decode_update(payload, template)
        return
    got = decode_update(payload, template)
    for k, v in expected.items():
        np.testing.assert_array_equal(got[k], v)


def test_fold_matches_a_direct_weighted_mean() -> None:
    agg = WeightedMeanAggregator(template_of(UPDATE))
    second = {k: v * 3 + 1 for k, v in UPDATE.items()}
    agg.add("a", UPDATE, 2.0)
    agg.add("b", second, 5.0)
    out = agg.result()
    for k, v in UPDATE.items():
        direct = (2.0 * v.astype(np.float64) + 5.0 * second[k].astype(np.float64)) / 7.0
        np.testing.assert_allclose(out[k], direct.astype(v.dtype), rtol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, FOLD_BLOCK + 16])
def test_validation_refuses_any_non_finite_value(bad: float, where: int) -> None:
    update = {k: v.copy() for k, v in UPDATE.items()}
    update["big"][where] = bad
    with pytest.raises(UpdateRejectedError, match=r"'big': 1 of \d+ values are NaN or infinite"):
        validate_update(update, num_samples=1)


def test_validation_accepts_finite_values_whose_squares_overflow() -> None:
    update = {"w": np.full(10, 3e30, np.float32)}  # each square overflows float32
    norm = validate_update(update, num_samples=1)
    assert norm == pytest.approx(np.sqrt(10) * 3e30, rel=1e-6)
    with pytest.raises(UpdateRejectedError, match="exceeds the bound"):
        validate_update(update, num_samples=1, max_norm=1e30)


def test_validation_norm_is_accurate() -> None:
    exact = np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in UPDATE.values()))
    assert validate_update(UPDATE, num_samples=1) == pytest.approx(exact, rel=1e-7)


SMALL = {  # one float dtype, fewer values than a norm block: summed as one gathered array
    "a": RNG.standard_normal((30, 40)).astype(np.float32),
    "b": RNG.standard_normal(17).astype(np.float32),
    "s": np.array(0.5, np.float32),
}


def test_a_small_update_of_one_dtype_has_an_accurate_norm_in_one_product() -> None:
    exact = np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in SMALL.values()))
    # float32 products over ~1.2k values: relative error well below 1e-6.
    assert validate_update(SMALL, num_samples=1) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_small_update_with_a_non_finite_value_is_refused_naming_its_tensor(bad: float) -> None:
    update = {k: v.copy() for k, v in SMALL.items()}
    update["b"][3] = bad
    with pytest.raises(UpdateRejectedError, match=r"'b': 1 of 17 values are NaN or infinite"):
        validate_update(update, num_samples=1)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    snap = WeightedMeanAggregator(template_of(UPDATE))
    snap.add("client-é", UPDATE, 3.0)
    path = tmp_path / "r.ckpt"
    save_arrays(path, snap.snapshot())
    restored = WeightedMeanAggregator(template_of(UPDATE))
    restored.restore(load_arrays(path))
    assert restored.clients == ["client-é"] and restored.total_weight == 3.0
    for k in UPDATE:
        np.testing.assert_array_equal(restored.result()[k], snap.result()[k])


def test_a_damaged_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.ckpt"
    save_arrays(path, {"sum/w": np.ones(1000)})
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    with pytest.raises(AggregationError, match="CRC-32"):
        load_arrays(path)
    flipped = bytearray(whole)
    flipped[-8] ^= 0x01  # one bit of one float: still a well-formed file
    path.write_bytes(bytes(flipped))
    with pytest.raises(AggregationError, match="CRC-32"):
        load_arrays(path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(AggregationError, match="unreadable"):
        load_arrays(path)


def test_a_new_version_written_at_the_weights_offsets_is_lites_splice(tmp_path: Path) -> None:
    make_model(tmp_path / "init.spore")
    table = {"state_dir": str(tmp_path / "s"), "model": str(tmp_path / "init.spore")}
    m = RoundManager(build_config(table, {}), metrics=Metrics(), logger=logging.getLogger("t"))
    try:
        model = m.model
        new = {k: (w + 1.5).astype(w.dtype) for k, w in model.weights.items()}
        data = model.with_weights(new)
        assert data == replace_weights_bytes(model.data, new)  # byte for byte
        for k, w in read_weights(data).items():
            expected = new.get(k, read_weights(model.data)[k])
            np.testing.assert_array_equal(w, expected)
        one = dict(list(new.items())[:1])  # some of the weights: the others stay
        assert model.with_weights(one) == replace_weights_bytes(model.data, one)
        name, w = next(iter(new.items()))
        with pytest.raises(InputError, match=name):  # lite says what does not match
            model.with_weights({name: w.astype(np.float64)})
    finally:
        m.close()
