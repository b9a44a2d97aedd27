"""int16x8 forms of the int8 kernels whose TFLite arithmetic does not depend on the width,
and the int16 lookup tables.

Unchanged but for the dtype (TFLite's reference kernels run the same integer steps on
int16): Relu/Relu6 (a clamp, or MultiplyByQuantizedMultiplier then a clamp), LeakyRelu
(two multipliers, as a table over every input), MaxPool and AvgPool (TFLite's rounded integer
average), Concat (inputs requantized to the output's parameters).

Tables over all 65536 inputs, indexed by the input's bits viewed as uint16:
- Abs: TFLite's integer form, |q - z_in| requantized by s_in / s_out (s_in / s_out in
  float32, as LiteRT computes it) when the scales differ, plus z_out, clamped.

Logistic and Tanh are in int16_sigmoid.py, Softmax in int16_softmax.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.kernels import elementwise
from sporenet.lite.kernels.base import Attrs, Compute, TensorSpec, required
from sporenet.lite.kernels.quantized.activation import QRelu, QRelu6, _params
from sporenet.lite.kernels.quantized.base import INT16_DTYPES, QuantizedKernel, dtype_range
from sporenet.lite.kernels.quantized.convert import Requantize
from sporenet.lite.kernels.quantized.elementwise_extra import (
    QEqual,
    QLeakyRelu,
    QMaximum,
    QMinimum,
    QPRelu,
    QStored,
)
from sporenet.lite.kernels.quantized.fixed_point import Requantizer
from sporenet.lite.kernels.quantized.pooling import QAvgPool2D, QMaxPool2D
from sporenet.lite.kernels.quantized.reduce import QReduceMax, QReduceMean, QReduceMin, QReduceSum
from sporenet.lite.kernels.quantized.resize import QResize
from sporenet.lite.kernels.quantized.shape import QConcat
from sporenet.lite.ops import OpCode


def int16_form(base: type[QuantizedKernel]) -> type[QuantizedKernel]:
    """The int16 form of an int8 kernel whose TFLite arithmetic does not depend on the
    width: the same class, taking int16 activations."""
    return type(
        f"{base.__name__}16",
        (base,),
        {"accepts": INT16_DTYPES, "__doc__": f"int16 {base.__name__}."},
    )


QRelu16 = int16_form(QRelu)
QRelu6_16 = int16_form(QRelu6)
QLeakyRelu16 = int16_form(QLeakyRelu)
QMaxPool2D16 = int16_form(QMaxPool2D)
QAvgPool2D16 = int16_form(QAvgPool2D)
QConcat16 = int16_form(QConcat)
QMaximum16 = int16_form(QMaximum)
QMinimum16 = int16_form(QMinimum)
QEqual16 = int16_form(QEqual)  # LiteRT rescales int16 operands for EQUAL only
QReduceMean16 = int16_form(QReduceMean)
QReduceSum16 = int16_form(QReduceSum)
QReduceMax16 = int16_form(QReduceMax)
QReduceMin16 = int16_form(QReduceMin)
QResize16 = int16_form(QResize)
QRequantize16 = int16_form(Requantize)  # int16 -> int16 or int8 with new parameters


class QPRelu16(QPRelu):
    """int16 PRELU: LiteRT reads the slopes (input 1) as int8, as int16x8 weights."""

    accepts = INT16_DTYPES
    quantized_weights = frozenset({1})  # the int8 slopes are read as stored

    def quantized_input(self, index: int) -> TensorSpec:
        if index == 0:
            return super().quantized_input(index)
        spec = self.input(index)
        if spec.dtype != np.int8 or spec.quant is None:
            raise self.fail(
                f"alpha (input {index}) must be int8 with quantization, got {spec.dtype}"
            )
        return spec


class _QRawCompare16(QStored):
    """LiteRT orders int16 operands (GREATER, LESS and their or-equal forms) as stored,
    whatever their parameters; its EQUAL rescales them as for int8 (QEqual16)."""

    accepts = INT16_DTYPES


class QGreater16(_QRawCompare16):
    op = OpCode.GREATER
    base = elementwise.Greater


class QLess16(_QRawCompare16):
    op = OpCode.LESS
    base = elementwise.Less


def _inputs16() -> np.ndarray:
    """Every int16 value, in the order of its bits read as uint16."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16).astype(np.int64)


class _QTable16(QuantizedKernel):
    """A unary int16 op as one lookup in a 65536-entry table built at prepare time."""

    accepts = INT16_DTYPES

    def build(self, q: np.ndarray, sx: float, zx: int, so: float, zo: int) -> np.ndarray:
        """The int64 outputs for the inputs `q` (before the dtype clamp)."""
        raise NotImplementedError

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        x, sx, zx, so, zo = _params(self)
        lo, hi = dtype_range(x.dtype)
        self.table = np.clip(self.build(_inputs16(), sx, zx, so, zo), lo, hi).astype(x.dtype)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        index, out, table = required(inputs, 0).view(np.uint16), outputs[0], self.table

        def step() -> None:
            # Every value of the index dtype is in the table: mode="clip" skips the
            # default mode's bounds check, which copies through a buffer on every call.
            table.take(index, out=out, mode="clip")

        return step


class QNeg16(_QTable16):
    """LiteRT's NEG: the stored integers negated, whatever the parameters (-32768 wraps
    to itself, as the C++ cast does)."""

    op = OpCode.NEG

    def build(self, q: np.ndarray, sx: float, zx: int, so: float, zo: int) -> np.ndarray:
        return (-q).astype(np.int16).astype(np.int64)


class QAbs16(_QTable16):
    op = OpCode.ABS

    def build(self, q: np.ndarray, sx: float, zx: int, so: float, zo: int) -> np.ndarray:
        value = np.abs(q - zx)
        if np.float32(sx) != np.float32(so):
            Requantizer(float(np.float32(sx) / np.float32(so)), 0, 0, 0).multiply(value)
        return value + zo
