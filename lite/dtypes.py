"""Mapping between the IR's DType enum and NumPy dtypes.

STRING tensors are NumPy object arrays of Python `str` (as onnxruntime gives them); fixed
width unicode arrays (`<U5`) and bytes are accepted where a string tensor is fed. The
low-precision types (bfloat16, float8, float4, 4- and 2-bit integers) are lite/lowp.py's."""

from __future__ import annotations

import numpy as np

from sporenet.lite import lowp
from sporenet.lite.errors import ModelFormatError
from sporenet.proto.model_generated import DType

IR_TO_NUMPY: dict[int, np.dtype] = {
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT16: np.dtype(np.float16),
    DType.FLOAT64: np.dtype(np.float64),
    DType.INT8: np.dtype(np.int8),
    DType.UINT8: np.dtype(np.uint8),
    DType.INT16: np.dtype(np.int16),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.BOOL: np.dtype(np.bool_),
    DType.UINT16: np.dtype(np.uint16),
    DType.UINT32: np.dtype(np.uint32),
    DType.UINT64: np.dtype(np.uint64),
    DType.COMPLEX64: np.dtype(np.complex64),
    DType.STRING: np.dtype(object),
    # Low-precision types: one-field structured dtypes over their bit patterns (lite/lowp.py).
    DType.BFLOAT16: lowp.BFLOAT16,
    DType.FLOAT8E4M3FN: lowp.FLOAT8E4M3FN,
    DType.FLOAT8E4M3FNUZ: lowp.FLOAT8E4M3FNUZ,
    DType.FLOAT8E5M2: lowp.FLOAT8E5M2,
    DType.FLOAT8E5M2FNUZ: lowp.FLOAT8E5M2FNUZ,
    DType.UINT4: lowp.UINT4,
    DType.INT4: lowp.INT4,
    DType.FLOAT4E2M1: lowp.FLOAT4E2M1,
    DType.FLOAT8E8M0: lowp.FLOAT8E8M0,
    DType.UINT2: lowp.UINT2,
    DType.INT2: lowp.INT2,
}
NUMPY_TO_IR: dict[np.dtype, int] = {v: k for k, v in IR_TO_NUMPY.items()}
STRING = np.dtype(object)
"""The NumPy dtype of the IR's STRING tensors."""


def is_string(dtype: np.dtype | type) -> bool:
    """Whether `dtype` holds text: object (of str), fixed-width unicode or bytes."""
    return np.dtype(dtype).kind in "OUS"


def as_strings(array: np.ndarray) -> np.ndarray:
    """`array` (unicode, bytes or object) as an object array of str, the STRING layout."""
    if array.dtype == STRING and all(isinstance(v, str) for v in array.flat):
        return array
    out = np.empty(array.shape, STRING)
    out.flat[:] = [v.decode() if isinstance(v, bytes) else str(v) for v in array.flat]
    return out


def to_numpy_dtype(code: int) -> np.dtype:
    """The NumPy dtype of an IR dtype code; unknown codes are a format error."""
    try:
        return IR_TO_NUMPY[code]
    except KeyError:
        raise ModelFormatError(
            f"unknown dtype code {code}; expected one of {sorted(IR_TO_NUMPY)}"
        ) from None


def to_ir_dtype(dtype: np.dtype | type) -> int:
    """The IR dtype code of a NumPy dtype."""
    dt = np.dtype(dtype)
    if dt.kind in "US":
        return DType.STRING
    try:
        return NUMPY_TO_IR[dt]
    except KeyError:
        raise ModelFormatError(
            f"dtype {dt} cannot be stored; supported: {[str(d) for d in NUMPY_TO_IR]}"
        ) from None
