"""Low-precision element types (ONNX's bfloat16, float8, float4, 4- and 2-bit integers).

NumPy has none of them, and lite needs nothing but NumPy, so each is a one-field structured
dtype over its bit pattern (`np.dtype([("bfloat16", "<u2")])`): arrays of it reshape,
transpose, gather and concatenate like any other, arithmetic on them raises instead of
computing on bit patterns, and they view as `ml_dtypes` arrays of the same name (the
field's name is ml_dtypes' name of the type). 4- and 2-bit elements take one byte each in
memory, the pattern in the low bits (ml_dtypes' layout); a .spore constant packs them as
ONNX does (`pack`/`unpack`).

Kernels compute on them in float32 (the integers in int8/uint8): `decode` widens exactly;
`encode` narrows with round-to-nearest-even and ONNX's saturation rules for Cast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LowpType:
    """One type: its name, width and, for floats, the layout of its bits.

    `special` says which patterns are not finite: "ieee" (all-ones exponent: inf or NaN),
    "fn" (only all-ones exponent and mantissa is NaN; no inf), "fnuz" (the negative zero
    pattern is the only NaN; no inf, no -0), "none" (every pattern finite)."""

    name: str
    bits: int
    kind: str  # "float", "int" (two's complement) or "uint"
    exponent: int = 0
    mantissa: int = 0
    bias: int = 0
    special: str = "none"

    @property
    def dtype(self) -> np.dtype:
        return _DTYPES[self.name]

    @property
    def compute(self) -> np.dtype:
        """The dtype kernels compute this type in."""
        return np.dtype({"float": np.float32, "int": np.int8, "uint": np.uint8}[self.kind])

    @property
    def storage(self) -> np.dtype:
        """The unsigned integer dtype of one element's bit pattern in memory."""
        return np.dtype(np.uint16 if self.bits == 16 else np.uint8)

    @property
    def max_finite(self) -> float:
        top = (1 << self.exponent) - 1  # the all-ones exponent field
        if self.special == "ieee":
            top -= 1
        mantissa = (1 << self.mantissa) - 1
        if self.special == "fn":
            mantissa -= 1  # all ones is NaN
        return float(np.ldexp(1.0 + mantissa / (1 << self.mantissa), top - self.bias))


TYPES: dict[str, LowpType] = {
    t.name: t
    for t in (
        LowpType("bfloat16", 16, "float", 8, 7, 127, "ieee"),
        LowpType("float8_e4m3fn", 8, "float", 4, 3, 7, "fn"),
        LowpType("float8_e4m3fnuz", 8, "float", 4, 3, 8, "fnuz"),
        LowpType("float8_e5m2", 8, "float", 5, 2, 15, "ieee"),
        LowpType("float8_e5m2fnuz", 8, "float", 5, 2, 16, "fnuz"),
        # Exponent only, unsigned: 2**(bits - 127); 0xFF is NaN (no zero, no sign).
        LowpType("float8_e8m0fnu", 8, "float", 8, 0, 127, "e8m0"),
        LowpType("float4_e2m1fn", 4, "float", 2, 1, 1, "none"),
        LowpType("int4", 4, "int"),
        LowpType("uint4", 4, "uint"),
        LowpType("int2", 2, "int"),
        LowpType("uint2", 2, "uint"),
    )
}
_DTYPES: dict[str, np.dtype] = {
    name: np.dtype([(name, "<u2" if t.bits == 16 else "u1")]) for name, t in TYPES.items()
}
BY_DTYPE: dict[np.dtype, LowpType] = {_DTYPES[name]: t for name, t in TYPES.items()}

BFLOAT16 = _DTYPES["bfloat16"]
FLOAT8E4M3FN = _DTYPES["float8_e4m3fn"]
FLOAT8E4M3FNUZ = _DTYPES["float8_e4m3fnuz"]
FLOAT8E5M2 = _DTYPES["float8_e5m2"]
FLOAT8E5M2FNUZ = _DTYPES["float8_e5m2fnuz"]
FLOAT8E8M0 = _DTYPES["float8_e8m0fnu"]
FLOAT4E2M1 = _DTYPES["float4_e2m1fn"]
INT4 = _DTYPES["int4"]
UINT4 = _DTYPES["uint4"]
INT2 = _DTYPES["int2"]
UINT2 = _DTYPES["uint2"]


def lowp_type(dtype: np.dtype | type) -> LowpType | None:
    """The low-precision type of `dtype` (None for NumPy's own dtypes)."""
    dt = np.dtype(dtype)
    return BY_DTYPE.get(dt) if dt.names else None


def is_lowp(dtype: np.dtype | type) -> bool:
    return lowp_type(dtype) is not None


def bit_patterns(array: np.ndarray) -> np.ndarray:
    """The elements of a low-precision array as unsigned integers (a view, no copy)."""
    t = _require(array.dtype)
    return array.view(t.storage)


def from_bit_patterns(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Unsigned bit patterns as a `dtype` array (a view when `bits` has the storage dtype)."""
    t = _require(dtype)
    return np.ascontiguousarray(bits, t.storage).view(t.dtype)


def as_lowp(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """`array` viewed as low-precision `dtype` when it already holds that type (this dtype,
    or a foreign one of the same name and width, such as ml_dtypes'); else None."""
    t = _require(dtype)
    if array.dtype == t.dtype:
        return array
    if array.dtype.name == t.name and array.dtype.itemsize == t.dtype.itemsize:
        return np.ascontiguousarray(array).view(t.dtype)
    return None


def from_foreign(array: np.ndarray) -> np.ndarray:
    """`array` as its low-precision type when its dtype is another library's of a type this
    module knows (ml_dtypes' bfloat16, int4, ...: same name, same width); else unchanged."""
    t = TYPES.get(array.dtype.name)
    if t is None or array.dtype.names or array.dtype.itemsize != t.dtype.itemsize:
        return array
    return np.ascontiguousarray(array).view(t.dtype)


def _require(dtype: np.dtype | type) -> LowpType:
    t = lowp_type(dtype)
    if t is None:
        raise TypeError(f"{np.dtype(dtype)} is not a low-precision element type")
    return t


# --------------------------------------------------------------------------- decode


def _float_table(t: LowpType) -> np.ndarray:
    """The float32 value of every bit pattern of an 8-bit-or-narrower float type."""
    codes = np.arange(1 << t.bits, dtype=np.int64)
    if t.special == "e8m0":
        values = np.ldexp(1.0, codes - t.bias)
        values[codes == 0xFF] = np.nan
        return values.astype(np.float32)
    return _decode_fields(codes, t).astype(np.float32)


def _decode_fields(codes: np.ndarray, t: LowpType) -> np.ndarray:
    m, e = t.mantissa, t.exponent
    sign = (codes >> (e + m)) & 1
    exp = (codes >> m) & ((1 << e) - 1)
    man = codes & ((1 << m) - 1)
    emin = 1 - t.bias
    values = np.where(
        exp == 0,
        np.ldexp(man.astype(np.float64), emin - m),
        np.ldexp((man + (1 << m)).astype(np.float64), exp - t.bias - m),
    )
    values = np.where(sign == 1, -values, values)
    top = (1 << e) - 1
    if t.special == "ieee":
        values = np.where((exp == top) & (man == 0), np.copysign(np.inf, values), values)
        values = np.where((exp == top) & (man != 0), np.nan, values)
    elif t.special == "fn":
        values = np.where((exp == top) & (man == (1 << m) - 1), np.nan, values)
    elif t.special == "fnuz":
        values = np.where(codes == 1 << (e + m), np.nan, values)
    return values


_TABLES: dict[str, np.ndarray] = {
    name: _float_table(t) for name, t in TYPES.items() if t.kind == "float" and t.bits <= 8
}


def decode(array: np.ndarray) -> np.ndarray:
    """A low-precision array's values, exactly: float32 for the float types, int8/uint8 for
    the integer ones."""
    t = _require(array.dtype)
    bits = array.view(t.storage)
    if t.name == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    if t.kind == "float":
        return _TABLES[t.name][bits]
    if t.kind == "uint":
        return bits.astype(np.uint8)
    half = 1 << (t.bits - 1)
    return (bits.astype(np.int16) - ((bits >= half) << t.bits)).astype(np.int8)


# --------------------------------------------------------------------------- encode


def encode(
    x: np.ndarray, dtype: np.dtype, *, saturate: bool = True, round_mode: str = "up"
) -> np.ndarray:
    """`x` (any real or bool array) converted to low-precision `dtype` as ONNX's Cast does.

    Floats round to nearest even. With `saturate`, finite values beyond the range (and
    infinities) become the largest finite value of their sign; without it, they become
    inf where the type has one, else NaN. float4e2m1 always saturates and, having no NaN,
    gives NaN as zero. float8e8m0 (powers of two) rounds as `round_mode` says ("up",
    "down", "nearest") the float32 exponent. Integers truncate toward zero; values outside
    the type's range (and NaN) give 0, as ONNX's reference does."""
    t = _require(dtype)
    # NaN and overflow are handled explicitly below: NumPy's warnings about them are noise.
    with np.errstate(invalid="ignore", over="ignore"):
        if t.kind != "float":
            return from_bit_patterns(_encode_int(np.asarray(x), t), t.dtype)
        x32 = np.asarray(x).astype(np.float32)
        if t.special == "e8m0":
            bits = _encode_e8m0(x32, saturate, round_mode)
        elif t.name == "bfloat16":
            bits = _encode_bfloat16(x32)
        else:
            bits = _encode_minifloat(x32, t, saturate or t.special == "none")
    return from_bit_patterns(bits, t.dtype)


def _encode_int(x: np.ndarray, t: LowpType) -> np.ndarray:
    lo, hi = (
        (-(1 << (t.bits - 1)), (1 << (t.bits - 1)) - 1)
        if t.kind == "int"
        else (0, (1 << t.bits) - 1)
    )
    if x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            v = np.trunc(x.astype(np.float64))
            ok = (v >= lo) & (v <= hi)  # NaN compares False
        v = np.where(ok, v, 0).astype(np.int64)
    else:
        v = x.astype(np.int64)
        v = np.where((v >= lo) & (v <= hi), v, 0)
    return (v & ((1 << t.bits) - 1)).astype(np.uint8)


def _encode_bfloat16(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # nearest, ties to even
    quiet_nan = 0x7FC0 | ((bits >> 16) & 0x8000)  # keeps the sign
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def _encode_minifloat(x: np.ndarray, t: LowpType, saturate: bool) -> np.ndarray:
    m, e = t.mantissa, t.exponent
    x64 = x.astype(np.float64)
    nan = np.isnan(x64)
    negative = np.signbit(x64) & ~nan
    a = np.where(np.isfinite(x64), np.abs(x64), 0.0)
    emin = 1 - t.bias
    _, k = np.frexp(a)  # a = f * 2**k, 0.5 <= f < 1 (k = 0 for a = 0)
    quantum = np.ldexp(1.0, np.maximum(k - 1, emin) - m)
    r = np.rint(a / quantum) * quantum  # exact in float64; rint ties to even
    _, k = np.frexp(r)
    normal = (k - 1 >= emin) & (r > 0)
    exp = np.where(normal, k - 1 + t.bias, 0)
    man = np.where(normal, np.ldexp(r, m - (k - 1)) - (1 << m), np.ldexp(r, m - emin))
    bits = (exp.astype(np.int64) << m) | man.astype(np.int64)
    top = (1 << e) - 1
    max_bits = (top - (t.special == "ieee")) << m | ((1 << m) - 1 - (t.special == "fn"))
    overflow = (r > t.max_finite) | np.isinf(x64)
    if saturate:
        bits = np.where(overflow, max_bits, bits)
    elif t.special == "ieee":
        bits = np.where(overflow, top << m, bits)
    sign_bit = 1 << (e + m)
    if t.special == "fnuz":
        negative &= bits != 0  # no negative zero
    bits = np.where(negative, bits | sign_bit, bits)
    nan_bits = {
        "ieee": (top << m) | (1 << (m - 1)),
        "fn": (top << m) | ((1 << m) - 1),
        "fnuz": sign_bit,
        "none": sign_bit,  # no NaN: a (negative) zero
    }[t.special]
    if not saturate and t.special in ("fn", "fnuz"):
        nan = nan | overflow
    bits = np.where(nan, nan_bits, bits)
    return bits.astype(t.storage)


def _encode_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    bits = x.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int64)
    man = (bits & 0x7FFFFF).astype(np.int64)
    special = exp == 0xFF
    if round_mode == "up":
        exp = exp + (man != 0)
    elif round_mode == "nearest":
        # The midpoint (mantissa 0.5) rounds up, except from the subnormal range (exponent
        # field 0 is the even neighbour there).
        exp = exp + ((man > 0x400000) | ((man == 0x400000) & (exp > 0)))
    if saturate:
        exp = np.minimum(exp, 0xFE)
    exp = np.where(special | (exp > 0xFF), 0xFF, exp)
    return exp.astype(np.uint8)


# --------------------------------------------------------------------------- file layout


def packed_size(count: int, dtype: np.dtype) -> int:
    """Bytes that `count` elements of `dtype` take in a .spore buffer."""
    t = _require(dtype)
    per_byte = 8 // t.bits if t.bits < 8 else 1
    return -(-count // per_byte) * (t.bits // 8 if t.bits >= 8 else 1)


def pack(array: np.ndarray) -> np.ndarray:
    """The buffer bytes of a low-precision array: 4- and 2-bit elements packed, the first
    in the low bits (ONNX's layout); wider ones as their little-endian bit patterns."""
    t = _require(array.dtype)
    bits = np.ascontiguousarray(array).view(t.storage).reshape(-1)
    if t.bits >= 8:
        return bits.astype(t.storage.newbyteorder("<")).view(np.uint8)
    per_byte = 8 // t.bits
    padded = np.zeros(-(-bits.size // per_byte) * per_byte, np.uint8)
    padded[: bits.size] = bits & ((1 << t.bits) - 1)
    groups = padded.reshape(-1, per_byte)
    shifts = np.arange(per_byte, dtype=np.uint8) * t.bits
    return np.bitwise_or.reduce(groups << shifts, axis=1).astype(np.uint8)


def unpack(buffer: memoryview | bytes, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A `dtype` array of `shape` from its buffer bytes (the size checked by the caller)."""
    t = _require(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.frombuffer(buffer, np.uint8)
    if t.bits >= 8:
        bits = raw.view(t.storage.newbyteorder("<")).astype(t.storage)
    else:
        per_byte = 8 // t.bits
        shifts = np.arange(per_byte, dtype=np.uint8) * t.bits
        bits = ((raw[:, None] >> shifts) & ((1 << t.bits) - 1)).reshape(-1)[:count]
    return bits.astype(t.storage).view(t.dtype).reshape(shape)
