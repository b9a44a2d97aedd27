"""The state of one TFLite import: TFLite tensors as IR tensors in a tracked axis order.

TFLite lays images out NHWC; the IR's convolutions and pools take NCHW. Rather than
wrapping every convolution in a pair of transposes, each TFLite tensor is held as an IR
tensor together with `perm`, the order of its axes: ir = numpy.transpose(tflite, perm).
Convolutions produce NCHW values (perm (0, 3, 1, 2)); elementwise ops, activations, pads,
concatenations and means work in whatever order their inputs come in (their axes are
remapped); only ops that depend on the memory order (reshape, fully connected, ...) ask
for the TFLite order back, and a Transpose is emitted there, once per tensor and order.
A TFLite TRANSPOSE only changes the recorded order. Constants are transposed at
conversion time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.tflite_import.reader import TfliteModel, TfliteOperator, TfliteTensor
from sporenet.lite.ops import OpCode

Perm = tuple[int, ...]
NCHW: Perm = (0, 3, 1, 2)


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def compose(current: Perm, wanted: Perm) -> list[int]:
    """The Transpose perm taking a tensor held in order `current` to order `wanted`."""
    return [current.index(axis) for axis in wanted]


class LayoutContext:
    """TFLite tensor index -> (IR tensor index, axis order), on top of an ImportContext."""

    def __init__(self, model: TfliteModel, ctx: ImportContext) -> None:
        self.model = model
        self.ctx = ctx
        self.held: dict[int, tuple[int, Perm]] = {}
        self._orders: dict[tuple[int, Perm], int] = {}
        # TFLite tensors that are float16 constants widened by DEQUANTIZE: held as the
        # float16 constant, transposed as needed at conversion, widened by a CAST node
        # the runtime folds when the model loads (the file keeps the float16 data).
        self.widened: set[int] = set()
        self.op: TfliteOperator | None = None

    # ---- reading TFLite tensors
    def tensor(self, index: int) -> TfliteTensor:
        return self.model.tensors[index]

    def fail(self, message: str) -> ConversionError:
        op = self.op
        where = f"operator {op.index} ({op.op})" if op is not None else "the model"
        return ConversionError(f"{where}: {message}")

    def constant_value(self, index: int, what: str) -> np.ndarray:
        """The value of a TFLite input that must be a constant (axes, shapes, paddings)."""
        if index == -1:
            raise self.fail(f"{what} is required")
        tensor = self.tensor(index)
        value = tensor.data
        if value is None and index in self.held:
            value = self.ctx.value(self.held[index][0])
        if value is None:
            raise self.fail(f"{what} (tensor {tensor.name!r}) must be a constant")
        return np.asarray(value)

    def shape(self, index: int) -> tuple[int, ...]:
        """The TFLite shape, -1 where the model's signature leaves a dimension open."""
        return self.tensor(index).signature

    def rank(self, index: int) -> int:
        return len(self.tensor(index).shape)

    def perm(self, index: int) -> Perm:
        return self.held[index][1]

    # ---- IR values
    def get(self, index: int, order: Perm | None = None) -> int:
        """The IR tensor holding TFLite tensor `index` in axis order `order` (TFLite's own
        order by default); a Transpose is emitted (or folded, for constants) if needed."""
        ir, current = self.held[index]
        if order is None:
            order = identity(len(current))
        key = (ir, order)
        if key in self._orders:
            return self._orders[key]
        if current != order:
            ir = self.ctx.emit1(OpCode.TRANSPOSE, [ir], perm=compose(current, order))
        if index in self.widened:
            ir = self.ctx.emit1(OpCode.CAST, [ir], to="float32")
        self._orders[key] = ir
        return ir

    def get_broadcast(self, index: int, order: Perm) -> int:
        """Input `index` of a broadcasting op whose output has axis order `order`: a
        lower-rank input is first given leading unit axes (NumPy's broadcasting rule)."""
        rank = self.rank(index)
        if rank == len(order):
            return self.get(index, order)
        ir = self.get(index)
        shape = [1] * (len(order) - rank) + list(self.tensor(index).shape)
        ir = self.ctx.emit1(OpCode.RESHAPE, [ir], shape=shape)
        if order == identity(len(order)):
            return ir
        return self.ctx.emit1(OpCode.TRANSPOSE, [ir], perm=list(order))

    def set(self, index: int, ir: int, order: Perm | None = None) -> None:
        """Record that TFLite tensor `index` is IR tensor `ir` in axis order `order`."""
        self.held[index] = (ir, order if order is not None else identity(self.rank(index)))

    def emit(self, op: OpCode, inputs: Sequence[int], **attrs: Any) -> int:
        return self.ctx.emit1(op, inputs, **attrs)
