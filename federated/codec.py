"""Update payloads: named float tensors <-> TensorBundle bytes, with optional compression.

Compression applies to deltas (trained minus global weights), where it loses little:
- "int8": symmetric per-tensor quantization, value = q * scale, scale = max|x| / 127;
- "topk": only the `topk_ratio` largest-magnitude entries, as flat uint32 positions and
  float32 values (combine with "int8" to quantize the kept values too).
Decoding is strict: every inconsistency is an `UpdateRejectedError` naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from google.protobuf.message import DecodeError

from sporenet.federated.aggregation import Template, Weights
from sporenet.federated.errors import ConfigError, UpdateRejectedError
from sporenet.proto import federated_pb2 as pb

COMPRESSIONS = ("int8", "topk")
_INT8_MAX = 127.0


def _quantize_int8(x: np.ndarray) -> tuple[bytes, float]:
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    scale = peak / _INT8_MAX if peak > 0 else 1.0
    q = np.clip(np.rint(x / scale), -_INT8_MAX, _INT8_MAX).astype(np.int8)
    return q.tobytes(), scale


def encode_update(
    update: Mapping[str, np.ndarray],
    *,
    compression: tuple[str, ...] | list[str] = (),
    topk_ratio: float = 0.01,
) -> bytes:
    """Serialize named float arrays as a TensorBundle, compressed as asked."""
    unknown = sorted(set(compression) - set(COMPRESSIONS))
    if unknown:
        raise ConfigError(f"unknown compression {unknown}; supported: {list(COMPRESSIONS)}")
    if not 0.0 < topk_ratio <= 1.0:
        raise ConfigError(f"`topk_ratio` must be in (0, 1], got {topk_ratio}")
    bundle = pb.TensorBundle()
    for name, value in update.items():
        a = np.ascontiguousarray(value)
        t = bundle.tensors.add(name=name, dtype=a.dtype.name, shape=list(a.shape))
        flat = a.reshape(-1)
        if "topk" in compression:
            k = max(1, math.ceil(topk_ratio * flat.size)) if flat.size else 0
            idx = (
                np.sort(np.argpartition(np.abs(flat), flat.size - k)[flat.size - k :])
                if k
                else flat[:0]
            )
            t.indices = idx.astype("<u4").tobytes()
            values = flat[idx]
            if "int8" in compression:
                t.encoding = pb.ENCODING_TOPK_INT8
                t.data, t.scale = _quantize_int8(values)
            else:
                t.encoding = pb.ENCODING_TOPK
                t.data = values.astype("<f4").tobytes()
        elif "int8" in compression:
            t.encoding = pb.ENCODING_INT8
            t.data, t.scale = _quantize_int8(flat)
        else:
            t.encoding = pb.ENCODING_RAW
            t.data = flat.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return bundle.SerializeToString()


def decode_update(payload: bytes, template: Template) -> Weights:
    """Parse and decode a TensorBundle against the model's template.

    Checks the set of names, each shape and dtype, and the byte lengths and positions of
    compressed encodings; does not check finiteness (see validation.validate_update).
    """
    bundle = pb.TensorBundle()
    try:
        bundle.ParseFromString(payload)
    except DecodeError as e:
        raise UpdateRejectedError(f"update is not a valid TensorBundle: {e}") from None
    names = [t.name for t in bundle.tensors]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise UpdateRejectedError(f"update names tensors more than once: {dup}")
    missing, unknown = sorted(set(template) - set(names)), sorted(set(names) - set(template))
    if missing or unknown:
        raise UpdateRejectedError(
            f"update tensors do not match the model: missing {missing}, unknown {unknown}"
        )
    out: Weights = {}
    for t in bundle.tensors:
        shape, dtype = template[t.name]
        if tuple(t.shape) != shape or t.dtype != dtype.name:
            raise UpdateRejectedError(
                f"tensor {t.name!r}: expected {dtype.name}{list(shape)}, "
                f"got {t.dtype}{list(t.shape)}"
            )
        out[t.name] = _decode_tensor(t, shape, dtype)
    return out


def _decode_tensor(t: pb.NamedTensor, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    size = math.prod(shape)

    def expect_len(what: str, got: int, want: int) -> None:
        if got != want:
            raise UpdateRejectedError(f"tensor {t.name!r}: {what} is {got} bytes, expected {want}")

    def check_scale() -> float:
        if not (math.isfinite(t.scale) and t.scale >= 0):
            raise UpdateRejectedError(
                f"tensor {t.name!r}: int8 scale must be finite and >= 0, got {t.scale}"
            )
        return float(t.scale)

    if t.encoding == pb.ENCODING_RAW:
        data = t.data  # each access of a bytes field copies it: read once
        expect_len("data", len(data), size * dtype.itemsize)
        # A read-only view of the payload on little-endian hosts (no copy); aggregation
        # only reads it.
        return np.frombuffer(data, dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    if t.encoding == pb.ENCODING_INT8:
        expect_len("int8 data", len(t.data), size)
        q = np.frombuffer(t.data, np.int8)
        return (q.astype(np.float32) * check_scale()).astype(dtype).reshape(shape)
    if t.encoding in (pb.ENCODING_TOPK, pb.ENCODING_TOPK_INT8):
        if len(t.indices) % 4:
            raise UpdateRejectedError(
                f"tensor {t.name!r}: top-k indices are not whole uint32 values"
            )
        idx = np.frombuffer(t.indices, "<u4")
        if idx.size > size or (idx.size and int(idx.max()) >= size):
            raise UpdateRejectedError(
                f"tensor {t.name!r}: top-k positions out of range for {size} values"
            )
        if t.encoding == pb.ENCODING_TOPK:
            expect_len("top-k values", len(t.data), idx.size * 4)
            values = np.frombuffer(t.data, "<f4")
        else:
            expect_len("top-k int8 values", len(t.data), idx.size)
            values = np.frombuffer(t.data, np.int8).astype(np.float32) * check_scale()
        dense = np.zeros(size, dtype)
        dense[idx] = values
        return dense.reshape(shape)
    raise UpdateRejectedError(f"tensor {t.name!r}: unknown encoding {t.encoding}")
