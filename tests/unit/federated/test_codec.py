"""Update payload encoding, compression bounds and strict decoding; update validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sporenet.federated.aggregation import template_of
from sporenet.federated.common.codec import decode_update, encode_update
from sporenet.federated.errors import ConfigError, UpdateRejectedError
from sporenet.federated.server.validation import validate_update
from sporenet.proto import federated_pb2 as pb

DELTA = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.8,
    "b": np.array([0.5, -2.0, 0.0], np.float32),
}
TEMPLATE = template_of(DELTA)


def test_raw_round_trip_is_exact() -> None:
    got = decode_update(encode_update(DELTA), TEMPLATE)
    for k in DELTA:
        np.testing.assert_array_equal(got[k], DELTA[k])
        assert got[k].dtype == np.float32 and got[k].shape == DELTA[k].shape


@pytest.mark.parametrize("compression", [(), ("int8",), ("topk",)])
def test_zero_dimensional_tensors_keep_their_shape(compression: tuple[str, ...]) -> None:
    scalar = {"scale": np.array(0.0625, np.float32)}
    got = decode_update(encode_update(scalar, compression=compression), template_of(scalar))
    assert got["scale"].shape == ()
    np.testing.assert_allclose(got["scale"], 0.0625, rtol=1e-2)


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(-1e3, 1e3, width=32)))
def test_int8_error_is_at_most_half_a_step(x: np.ndarray) -> None:
    got = decode_update(encode_update({"t": x}, compression=["int8"]), template_of({"t": x}))["t"]
    step = float(np.max(np.abs(x))) / 127 if np.any(x) else 1.0
    assert np.all(np.abs(got.astype(np.float64) - x) <= step / 2 + 1e-6 * (1 + np.abs(x)))


def test_topk_keeps_the_largest_magnitudes_exactly() -> None:
    payload = encode_update(DELTA, compression=["topk"], topk_ratio=0.25)
    got = decode_update(payload, TEMPLATE)
    flat = DELTA["w"].ravel()
    keep = np.argsort(-np.abs(flat))[:3]  # ceil(0.25 · 12)
    want = np.zeros_like(flat)
    want[keep] = flat[keep]
    np.testing.assert_array_equal(got["w"].ravel(), want)
    assert len(payload) < len(encode_update(DELTA))
    both = decode_update(
        encode_update(DELTA, compression=["topk", "int8"], topk_ratio=0.25), TEMPLATE
    )
    np.testing.assert_allclose(
        both["w"].ravel()[keep], flat[keep], atol=np.abs(flat).max() / 254 + 1e-7
    )
    assert np.count_nonzero(both["w"]) <= 3


def test_unknown_compression_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown compression \\['zip'\\]"):
        encode_update(DELTA, compression=["zip"])


def _bundle(**fields: object) -> bytes:
    b = pb.TensorBundle()
    b.tensors.add(name="b", dtype="float32", shape=[3], data=np.zeros(3, np.float32).tobytes())
    t = b.tensors.add(
        name="w", dtype="float32", shape=[3, 4], data=np.zeros(12, np.float32).tobytes()
    )
    for k, v in fields.items():
        if k == "shape":
            del t.shape[:]
            t.shape.extend(v)  # type: ignore[arg-type]
        else:
            setattr(t, k, v)
    return b.SerializeToString()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xff\xff\xff", "not a valid TensorBundle"),
        (_bundle(shape=[4, 3]), "expected float32[3, 4], got float32[4, 3]"),
        (_bundle(dtype="float64"), "expected float32[3, 4], got float64[3, 4]"),
        (_bundle(data=b"\x00" * 47), "data is 47 bytes, expected 48"),
        (_bundle(name="v"), "missing ['w'], unknown ['v']"),
        (_bundle(encoding=pb.ENCODING_INT8, data=b"\x00" * 12, scale=float("nan")), "int8 scale"),
        (
            _bundle(
                encoding=pb.ENCODING_TOPK, indices=np.array([12], "<u4").tobytes(), data=b"\x00" * 4
            ),
            "out of range",
        ),
        (_bundle(encoding=pb.ENCODING_TOPK, indices=b"\x00" * 3), "whole uint32"),
        (_bundle(encoding=9), "unknown encoding 9"),
    ],
)
def test_decoding_refuses_inconsistent_payloads(payload: bytes, message: str) -> None:
    with pytest.raises(UpdateRejectedError) as info:
        decode_update(payload, TEMPLATE)
    assert message in str(info.value)


def test_duplicate_names_are_refused() -> None:
    b = pb.TensorBundle()
    for _ in range(2):
        b.tensors.add(name="b", dtype="float32", shape=[3], data=np.zeros(3, np.float32).tobytes())
    with pytest.raises(UpdateRejectedError, match="more than once: \\['b'\\]"):
        decode_update(b.SerializeToString(), {"b": ((3,), np.dtype(np.float32))})


def test_validation_refuses_non_finite_bad_counts_and_large_norms() -> None:
    assert validate_update(DELTA, num_samples=3) == pytest.approx(
        float(np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in DELTA.values())))
    )
    bad = {"w": DELTA["w"].copy(), "b": DELTA["b"]}
    bad["w"][0, 0] = np.inf
    with pytest.raises(UpdateRejectedError, match="'w': 1 of 12 values are NaN or infinite"):
        validate_update(bad, num_samples=1)
    with pytest.raises(UpdateRejectedError, match="num_samples must be > 0"):
        validate_update(DELTA, num_samples=0)
    with pytest.raises(UpdateRejectedError, match=r"exceeds the bound max_update_norm=0\.5"):
        validate_update(DELTA, num_samples=1, max_norm=0.5)


def test_hand_parser_skips_unknown_fields_and_reads_unpacked_shapes() -> None:
    payload = encode_update(DELTA) + b"\x78\x05"  # field 15 (varint 5), unknown to us
    got = decode_update(payload, TEMPLATE)
    np.testing.assert_array_equal(got["w"], DELTA["w"])
    # shape written unpacked (field 3, wire type 0 per element) is valid proto3 too
    inner = b"\x0a\x01b" + b"\x12\x07float32" + b"\x18\x03" + b"\x2a\x0c" + DELTA["b"].tobytes()
    bundle = pb.TensorBundle.FromString(encode_update({"w": DELTA["w"]}))
    raw = bundle.SerializeToString() + b"\x0a" + bytes([len(inner)]) + inner
    got = decode_update(raw, TEMPLATE)
    np.testing.assert_array_equal(got["b"], DELTA["b"])
    with pytest.raises(UpdateRejectedError, match="runs past"):
        decode_update(encode_update(DELTA)[:-3], TEMPLATE)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field2(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def test_hand_parser_reads_long_fields_split_shapes_and_refuses_field_zero() -> None:
    # A 200-character name and a 20,000-value tensor need two-byte lengths and two-byte
    # shape varints (the parser's slow path); a shape split into a packed run and an
    # unpacked element concatenates, as protobuf reads it.
    name = "n" * 200
    delta = {name: np.linspace(-1, 1, 20_000, dtype=np.float32).reshape(200, 100)}
    template = template_of(delta)
    np.testing.assert_array_equal(decode_update(encode_update(delta), template)[name], delta[name])
    tensor = (
        _field2(1, name.encode())
        + _field2(2, b"float32")
        + _field2(3, _varint(200))  # packed shape: [200]
        + b"\x18\x64"  # then one unpacked element: 100
        + _field2(5, delta[name].tobytes())
    )
    raw = _field2(1, tensor)
    assert list(pb.TensorBundle.FromString(raw).tensors[0].shape) == [200, 100]
    np.testing.assert_array_equal(decode_update(raw, template)[name], delta[name])
    with pytest.raises(UpdateRejectedError, match="field number 0"):
        decode_update(b"\x0a\x02\x02\x00", TEMPLATE)  # a tensor holding field 0
