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

Nodes on quantized (int8/uint8) tensors are added as the file declares them: their
outputs take the TFLite tensor's shape, dtype and quantization (the quantization axis
follows the axis order), and the planner checks their int8 kernels when the model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.tflite_import.reader import (
    Quant,
    TfliteModel,
    TfliteOperator,
    TfliteSubgraph,
    TfliteTensor,
)
from sporenet.lite.eager import prepare_kernel
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Node, Quantization
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.ops import OpCode

QUANTIZED = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))  # int16: int16x8

Perm = tuple[int, ...]
NCHW: Perm = (0, 3, 1, 2)


def identity(rank: int) -> Perm:
    return tuple(range(rank))


def quantization(quant: Quant | None, order: Perm) -> Quantization | None:
    """TFLite quantization parameters for a tensor held in axis order `order`."""
    if quant is None:
        return None
    axis = order.index(quant.axis) if quant.scale.size > 1 else 0
    return Quantization(scale=quant.scale, zero_point=quant.zero_point, axis=axis)


def compose(current: Perm, wanted: Perm) -> list[int]:
    """The Transpose perm taking a tensor held in order `current` to order `wanted`."""
    return [current.index(axis) for axis in wanted]


class LayoutContext:
    """TFLite tensor index -> (IR tensor index, axis order), on top of an ImportContext."""

    def __init__(
        self,
        model: TfliteModel,
        ctx: ImportContext,
        graph: TfliteSubgraph | None = None,
        shared: Any = None,
    ) -> None:
        self.model = model
        self.graph = graph if graph is not None else model.main  # the subgraph imported
        self.ctx = ctx
        # What every subgraph's import shares (resource variables, subgraphs imported):
        # ops/variables.py and ops/control_flow.py keep it.
        self.shared = shared
        self.held: dict[int, tuple[int, Perm]] = {}
        self._orders: dict[tuple[int, Perm], int] = {}
        # TFLite tensors that are float16 constants widened by DEQUANTIZE: held as the
        # float16 constant, transposed as needed at conversion, widened by a CAST node
        # the runtime folds when the model loads (the file keeps the float16 data).
        self.widened: set[int] = set()
        self.op: TfliteOperator | None = None

    # ---- reading TFLite tensors
    def tensor(self, index: int) -> TfliteTensor:
        return self.graph.tensors[index]

    @property
    def where(self) -> str:
        """The operator being imported, for error messages."""
        op, s = self.op, self.graph.index
        graph = f"subgraph {s} " if s else ""
        return f"{graph}operator {op.index} ({op.op})" if op is not None else "the model"

    def sub(self, graph: TfliteSubgraph, ctx: ImportContext) -> LayoutContext:
        """A context importing another subgraph of the model, sharing `shared`."""
        return LayoutContext(self.model, ctx, graph, self.shared)

    def fail(self, message: str) -> ConversionError:
        return ConversionError(f"{self.where}: {message}")

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
        quant = self.ctx.tensors[ir].quantization
        if current != order and self.quantized_ir(ir) and quant is not None:
            ir = self._transpose_quantized(ir, quant, current, order)
        elif current != order:
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
        value = self.ctx.value(ir)
        if value is not None:  # constants: reshaped and transposed now
            moved = np.ascontiguousarray(value.reshape(shape).transpose(order))
            q = self.ctx.tensors[ir].quantization
            if q is not None and q.scale.size > 1:  # the axis moves with the leading units
                q = Quantization(q.scale, q.zero_point, order.index(q.axis + len(order) - rank))
            return self._constant_like(ir, moved, q)
        ir = self.ctx.emit1(OpCode.RESHAPE, [ir], shape=shape)
        if order == identity(len(order)):
            return ir
        return self.ctx.emit1(OpCode.TRANSPOSE, [ir], perm=list(order))

    def set(self, index: int, ir: int, order: Perm | None = None) -> None:
        """Record that TFLite tensor `index` is IR tensor `ir` in axis order `order`."""
        self.held[index] = (ir, order if order is not None else identity(self.rank(index)))

    def emit(
        self,
        op: OpCode,
        inputs: Sequence[int],
        *,
        out: int | None = None,
        order: Perm | None = None,
        **attrs: Any,
    ) -> int:
        """Add a node. With quantized inputs or output it is added as declared: its output
        is TFLite tensor `out` held in `order` (shape, dtype, quantization)."""
        if out is not None and (
            self.quantized(out) or any(i != -1 and self.quantized_ir(i) for i in inputs)
        ):
            t = self.tensor(out)
            if t.dtype is None:
                raise self.fail(f"output {t.name!r} has type {t.type_name}")
            order = order if order is not None else identity(len(t.shape))
            return self.raw(
                op,
                inputs,
                tuple(t.signature[a] for a in order),
                t.dtype,
                quantization(t.quant, order),
                attrs,
            )
        return self.ctx.emit1(op, inputs, **attrs)

    # ---- quantized tensors
    def quantized(self, index: int) -> bool:
        """Whether TFLite tensor `index` is an int8/uint8/int16 tensor with quantization."""
        t = self.tensor(index)
        return t.dtype in QUANTIZED and t.quant is not None

    def quantized_ir(self, ir: int) -> bool:
        t = self.ctx.tensors[ir]
        return t.dtype in QUANTIZED and t.quantization is not None

    def set_quantization(self, ir: int, quant: Quantization | None) -> None:
        """Attach quantization to an IR tensor and to what handlers see of it."""
        if quant is None:
            return
        self.ctx.tensors[ir].quantization = quant
        for view in self.ctx.views:
            spec = view[ir]
            view[ir] = TensorSpec(spec.shape, spec.dtype, spec.value, quant)

    def raw(
        self,
        op: OpCode,
        inputs: Sequence[int],
        shape: Sequence[int],
        dtype: np.dtype,
        quant: Quantization | None,
        attrs: dict[str, Any],
    ) -> int:
        """A node whose output shape, dtype and quantization are given, not inferred."""
        ctx = self.ctx
        inferred = self._infer_shapes(op, inputs, shape, dtype, quant, attrs)
        if inferred is not None:
            specs = [TensorSpec(s, np.dtype(dtype), quant=quant) for s in inferred]
        else:
            specs = [
                TensorSpec(
                    tuple(v if d == DYNAMIC else d for d in shape), np.dtype(dtype), quant=quant
                )
                for v in (1, 2)[: len(ctx.views)]
            ]
        base = f"{ctx.where or op.name.lower()}/{op.name.lower()}"
        index = ctx._add(base, specs, None)
        if inferred is None:
            ctx.tensors[index].shape = tuple(shape)
        ctx.tensors[index].quantization = quant
        ctx.nodes.append(
            Node(
                op=op,
                inputs=list(inputs),
                outputs=[index],
                attrs={k: v for k, v in attrs.items() if v is not None},
                name=ctx.tensors[index].name,
            )
        )
        return index

    def _infer_shapes(
        self,
        op: OpCode,
        inputs: Sequence[int],
        shape: Sequence[int],
        dtype: np.dtype,
        quant: Quantization | None,
        attrs: dict[str, Any],
    ) -> list[tuple[int, ...]] | None:
        """The output shape of a declared node under each view, where the file leaves a
        dimension open (-1): from the node's own kernel given its inputs' specs, as the
        planner will prepare it. None when the kernel cannot tell (the caller then fills
        the open dimensions with the probe sizes)."""
        if DYNAMIC not in shape:
            return None
        shapes = []
        for view in self.ctx.views:
            specs = [view.get(i) if i != -1 else None for i in inputs]
            if any(s is None for i, s in zip(inputs, specs, strict=True) if i != -1):
                return None
            try:
                kernel = prepare_kernel(
                    op,
                    {k: v for k, v in attrs.items() if v is not None},
                    specs,
                    1,
                    output_quant=[quant],
                    output_dtypes=[np.dtype(dtype)],
                )
            except (LiteError, ArithmeticError, LookupError, TypeError, ValueError):
                return None
            found = tuple(kernel.output_specs[0].shape)
            if len(found) != len(shape) or any(
                d not in (DYNAMIC, f) for d, f in zip(shape, found, strict=True)
            ):
                return None
            shapes.append(found)
        return shapes

    def _constant_like(self, ir: int, value: np.ndarray, quant: Quantization | None) -> int:
        index = self.ctx.constant(f"{self.ctx.tensors[ir].name}/nchw", value)
        self.set_quantization(index, quant)
        return index

    def _transpose_quantized(self, ir: int, q: Quantization, current: Perm, order: Perm) -> int:
        perm = compose(current, order)
        t = self.ctx.tensors[ir]
        moved = Quantization(q.scale, q.zero_point, perm.index(q.axis) if q.scale.size > 1 else 0)
        value = self.ctx.value(ir)
        if value is not None:
            return self._constant_like(ir, np.ascontiguousarray(value.transpose(perm)), moved)
        return self.raw(
            OpCode.TRANSPOSE, [ir], [t.shape[a] for a in perm], t.dtype, moved, {"perm": perm}
        )
