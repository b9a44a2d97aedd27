"""Low-precision element types (lite/lowp.py): conversions against ml_dtypes and ONNX's
reference, the packed file layout, the validator and the Interpreter."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelFormatError, lowp, parse, serialize
from sporenet.lite.graph import Quantization
from sporenet.lite.validate import validate
from tests.unit.lite.format_samples import lowp_model, raw_serialize

ml_dtypes = pytest.importorskip("ml_dtypes")  # onnx's dependency: the reference here

FLOATS = [n for n, t in lowp.TYPES.items() if t.kind == "float" and n != "float8_e8m0fnu"]


def _values() -> np.ndarray:
    """Every float16 value (every rounding case of the 8-bit types, subnormals, inf, NaN)
    and random float32 values over 16 decades."""
    rng = np.random.default_rng(0)
    scale = np.float32(10.0) ** rng.integers(-8, 8, 20000).astype(np.float32)
    return np.concatenate(
        [
            np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32),
            rng.standard_normal(20000).astype(np.float32) * scale,
            np.array([3.4e38, -3.4e38, 1e-45], np.float32),
        ]
    )


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, zero signs included, NaN equal to NaN."""
    nan = np.isnan(a)
    return bool(
        np.array_equal(nan, np.isnan(b))
        and np.array_equal(a[~nan], b[~nan])
        and np.array_equal(np.signbit(a[~nan]), np.signbit(b[~nan]))
    )


@pytest.mark.parametrize("name", sorted(lowp.TYPES))
def test_every_bit_pattern_decodes_as_ml_dtypes_does(name):
    t = lowp.TYPES[name]
    codes = np.arange(1 << t.bits, dtype=t.storage)
    want = codes.view(getattr(ml_dtypes, name))
    got = lowp.decode(codes.view(t.dtype))
    if t.kind == "float":
        assert got.dtype == np.float32 and _same(got, want.astype(np.float32))
    else:
        assert got.tolist() == want.astype(np.int16).tolist()


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("saturate", [True, False])
def test_float_encoding_rounds_to_nearest_even_and_saturates_as_onnx_cast(name, saturate):
    x = _values()
    ref = getattr(ml_dtypes, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # ONNX's Cast: saturate clips to the finite range first (float8 only); bfloat16
        # never saturates; float4e2m1 always does.
        if (saturate and name.startswith("float8")) or name == "float4_e2m1fn":
            info = ml_dtypes.finfo(ref)
            want = np.clip(x, info.min, info.max).astype(ref).astype(np.float32)
        else:
            want = x.astype(ref).astype(np.float32)
    got = lowp.decode(lowp.encode(x, lowp.TYPES[name].dtype, saturate=saturate))
    keep = ~np.isnan(x)  # float4e2m1 has no NaN: ml_dtypes and ONNX disagree on its zero
    assert _same(got[keep], want[keep])


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [True, False])
def test_e8m0_encoding_matches_onnx_reference(mode, saturate):
    from onnx.numpy_helper import to_float8e8m0

    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.integers(0, 1 << 32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            np.array([0, 1, 1.5, 3, 0.75, np.inf, np.nan, 3.4e38, -2, 1.2e-38], np.float32),
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = to_float8e8m0(x, saturate, mode).view(np.uint8)
    got = lowp.encode(x, lowp.FLOAT8E8M0, saturate=saturate, round_mode=mode)
    assert np.array_equal(lowp.bit_patterns(got), want)


def test_integer_encoding_truncates_and_zeroes_out_of_range_as_onnx_reference():
    x = np.arange(-9, 16, dtype=np.float32)
    got = lowp.decode(lowp.encode(x + np.float32(0.5), lowp.INT4))
    v = np.trunc(x + 0.5)
    want = np.where((v >= -8) & (v <= 7), v, 0)
    assert got.tolist() == want.astype(np.int8).tolist()
    assert lowp.decode(lowp.encode(np.array([-1, 3, 4, np.nan]), lowp.UINT2)).tolist() == [
        0,
        3,
        0,
        0,
    ]


@pytest.mark.parametrize("name", ["int4", "uint4", "float4_e2m1fn", "int2", "uint2"])
def test_packing_is_onnxs(name):
    from onnx import numpy_helper

    t = lowp.TYPES[name]
    bits = np.random.default_rng(2).integers(0, 1 << t.bits, 37).astype(np.uint8)
    array = lowp.from_bit_patterns(bits, t.dtype)
    packed = lowp.pack(array)
    assert packed.tobytes() == numpy_helper.from_array(bits.view(getattr(ml_dtypes, name))).raw_data
    assert packed.size == lowp.packed_size(37, t.dtype)
    again = lowp.unpack(packed.tobytes(), (37,), t.dtype)
    assert np.array_equal(lowp.bit_patterns(again), bits)


def test_model_round_trips_and_runs_with_ml_dtypes_inputs():
    model = lowp_model()
    again = parse(serialize(model))
    for before, after in zip(model.tensors, again.tensors, strict=True):
        assert after.dtype == before.dtype
        if before.data is not None:
            assert np.array_equal(lowp.bit_patterns(after.data), lowp.bit_patterns(before.data))
    x = np.array([[1.5, -2.25, 3.0], [0.5, 100.0, -7.0]], ml_dtypes.bfloat16)
    out = Interpreter(model_content=serialize(model)).run({"x": x})
    f8 = np.linspace(-3, 3, 6).reshape(2, 3).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    ints = np.array([[-8, -1, 7], [0, 3, -5]]) + np.array([[0, 1, 2], [3, 2, 1]])
    want = (x.astype(np.float32) + f8 + ints).astype(ml_dtypes.bfloat16)
    assert out["y"].dtype == lowp.BFLOAT16
    assert np.array_equal(out["y"].view(ml_dtypes.bfloat16), want)
    # 100 is outside int4: ONNX's reference gives 0
    assert lowp.decode(out["as_int4"]).tolist() == [[1, -2, 3], [0, 0, -7]]


def test_hostile_packed_buffer_is_a_model_format_error():
    model = lowp_model()
    index = next(i for i, t in enumerate(model.tensors) if t.name == "i4")
    model.tensors[index].shape = (2, 5)  # 10 nibbles over a 3-byte buffer
    with pytest.raises(ModelFormatError, match="packed"):
        parse(raw_serialize(model))


def test_validator_refuses_wide_nibbles_and_quantized_lowp():
    model = lowp_model()
    index = next(i for i, t in enumerate(model.tensors) if t.name == "i4")
    bad = np.full((2, 3), 16, np.uint8).view(lowp.INT4)
    model.tensors[index].data = bad
    with pytest.raises(ModelFormatError, match="must be below 16"):
        validate(model)
    model = lowp_model()
    index = next(i for i, t in enumerate(model.tensors) if t.name == "f8")
    model.tensors[index].quantization = Quantization(np.ones(1, np.float32), np.zeros(1, np.int64))
    with pytest.raises(ModelFormatError, match="cannot be quantized"):
        validate(model)


def test_arithmetic_on_bit_patterns_is_refused():
    a = lowp.encode(np.ones(3), lowp.BFLOAT16)
    with pytest.raises(TypeError):
        a + a
