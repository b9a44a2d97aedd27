"""Mapping between the IR's DType enum and NumPy dtypes."""

from __future__ import annotations

import numpy as np

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
}
NUMPY_TO_IR: dict[np.dtype, int] = {v: k for k, v in IR_TO_NUMPY.items()}


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
    try:
        return NUMPY_TO_IR[dt]
    except KeyError:
        raise ModelFormatError(
            f"dtype {dt} cannot be stored; supported: {[str(d) for d in NUMPY_TO_IR]}"
        ) from None
