"""The state of one import: the IR tensor table being built and what is known about each tensor.

Every IR node is prepared with its runtime kernel as soon as it is emitted, so handlers can
ask for shapes, dtypes and (for static tensors) values of their inputs. A graph with dynamic
input dimensions is tracked under two assignments of those dimensions (the probes of
lite/dims.py): a dimension that differs between them is dynamic (-1), and a value that
differs is not static.
Nodes whose inputs are all static are folded into constants right away, unless the constant
would be much larger than its inputs (a ConstantOfShape fill stays a node the runtime folds
at load time, so the file stays small).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.in_place import TensorBytes
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.converter.passes.graph_utils import contiguous, should_materialize
from sporenet.lite.builder import unique_name
from sporenet.lite.dims import probe_shapes
from sporenet.lite.eager import fold, prepare_kernel
from sporenet.lite.errors import LiteError, ShapeError, UnsupportedOpError
from sporenet.lite.graph import DYNAMIC, Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.lite.kernels import KERNELS, QUANTIZED_KERNELS
from sporenet.lite.kernels.base import Kernel, TensorSpec
from sporenet.lite.ops import OpCode

MAX_TENSOR_BYTES = 1 << 32
DEFERRED_BYTES = 1 << 22
"""Static results of at least this many bytes that are not stored (the runtime computes
them at load) are computed here only when a handler asks for their value (`deferred`)."""
"""A node whose outputs would exceed this (4 GiB) is refused: a hostile or broken model must
not make the converter allocate without bound."""


class Scope:
    """ONNX value names visible while importing one graph. A subgraph's scope reaches its
    parent's names: a constant is used as it is (constants are global in the IR), any other
    outer value becomes an implicit input of the subgraph (recorded in `captured`), unless
    the scope is `inline` (a branch imported into its parent's graph)."""

    def __init__(
        self, ctx: ImportContext, parent: Scope | None = None, *, inline: bool = False
    ) -> None:
        # A weak reference: the context holds its scope, and a cycle would keep the
        # context's conversion-time values (float views of the weights) alive until the
        # garbage collector next ran, through the passes that follow the import.
        self.ctx = weakref.proxy(ctx)
        self.parent = parent
        self.inline = inline
        self.names: dict[str, int] = {}
        self.captured: dict[int, int] = {}  # outer tensor -> this graph's input standing for it

    def capture(self, outer: int) -> int:
        """The tensor standing for the enclosing graph's tensor `outer` in this subgraph."""
        if self.inline or outer in self.ctx.static:
            return outer
        if outer not in self.captured:
            self.captured[outer] = self.ctx.input_like(outer)
        return self.captured[outer]

    def lookup(self, name: str) -> int | None:
        if name in self.names:
            return self.names[name]
        outer = self.parent.lookup(name) if self.parent is not None else None
        if outer is None:
            return None
        self.names[name] = self.capture(outer)
        return self.names[name]


class ImportContext:
    """Builds the IR tensor table and node list for one graph while tracking tensor specs."""

    def __init__(self, *, dynamic: bool, reserved: Iterable[str] = ()) -> None:
        self._derived: dict[tuple[Hashable, ...], int] = {}
        self.tensors: list[Tensor] = []
        self.nodes: list[Node] = []
        self.inputs: list[int] = []
        # One spec map per assignment of dynamic dimensions (1, and 2 when any are dynamic).
        self.views: list[dict[int, TensorSpec]] = [{}, {}] if dynamic else [{}]
        self.static: set[int] = set()
        # Static tensors whose values are computed only when asked for (`_force`): large
        # results the runtime computes at load anyway (a weight stored int8 and dequantized
        # by a Cast and a Mul), kept as the node that makes them: its op, attributes and
        # inputs, and its outputs.
        self.deferred: dict[int, tuple[OpCode, dict[str, Any], list[int], list[int]]] = {}
        # Values known only when the model runs, from graph inputs the runtime reads when it
        # plans (shape-like inputs and what is computed from them alone), and outputs of
        # nodes that need such a value to know their shapes (`opaque`: no spec here).
        self.fed: set[int] = set()
        self.opaque: set[int] = set()
        self._reserved = set(reserved)
        self._used: set[str] = set()
        self.where = ""  # the ONNX node being imported, for error messages
        self.emitted: set[OpCode] = set()  # IR ops asked for (folded or not), for the tests
        self.opset = 13
        self.scope = Scope(self)
        self.subgraphs: list[Graph] = []  # graphs 1.. of the model (shared by subcontexts)
        self.data: TensorBytes | None = None  # mapped bytes of the external tensors
        # DynamicQuantizeLinear's uint8 output -> (its zero point's uint8 tensor, the float
        # integers before the zero point is added, the float zero point): integer ops that
        # subtract the zero point again start from there (ops/quantized.py).
        self.centred: dict[int, tuple[int, int, int]] = {}
        # Model metadata handlers record (ZipMap's class labels, ops/ml_encoding.py).
        self.metadata: dict[str, str] = {}

    def subcontext(self, *, inline: bool = False) -> ImportContext:
        """A context for a subgraph: the same tensor table, its own nodes, inputs and scope
        (`inline`: the same nodes too, for a branch imported into this graph)."""
        sub = copy.copy(self)
        if not inline:
            sub.nodes, sub.inputs = [], []
        sub.scope = Scope(sub, self.scope, inline=inline)
        return sub

    def input_like(self, index: int, name: str = "") -> int:
        """A new graph input of this (sub)graph with the dtype and shape of tensor `index`."""
        specs = [TensorSpec(view[index].shape, view[index].dtype) for view in self.views]
        new = self._add(name or self.tensors[index].name, specs, None)
        self.tensors[new].shape = self.tensors[index].shape
        self.inputs.append(new)
        return new

    def add_subgraph(self, graph: Graph) -> int:
        """Store a subgraph; returns its graph index in the model (graph 0 is the main one)."""
        self.subgraphs.append(graph)
        return len(self.subgraphs)

    def emit_control(
        self, op: OpCode, inputs: Sequence[int], out_specs: list[list[TensorSpec]], **attrs: Any
    ) -> list[int]:
        """Add a node whose output specs the caller derived (per view, per output): control
        flow, whose kernel needs the whole model to prepare."""
        self.emitted.add(op)
        base = f"{self.where or op.name.lower()}/{op.name.lower()}"
        outputs = [
            self._add(f"{base}:{k}", [TensorSpec(s.shape, s.dtype) for s in views], None)
            for k, views in enumerate(out_specs)
        ]
        self._append_node(op, attrs, inputs, outputs, base)
        return outputs

    def _append_node(
        self,
        op: OpCode,
        attrs: dict[str, Any],
        inputs: Sequence[int],
        outputs: list[int],
        fallback_name: str = "",
    ) -> None:
        """Append the node, named after its first output (`fallback_name` if it has none)."""
        name = self.tensors[outputs[0]].name if outputs else fallback_name
        self.nodes.append(Node(op=op, inputs=list(inputs), outputs=outputs, attrs=attrs, name=name))

    # ---- naming
    def _fresh_name(self, base: str) -> str:
        return unique_name(base, self._used, reserved=self._reserved, sep="__")

    def rename(self, index: int, name: str) -> None:
        """Give a tensor the ONNX value name it stands for (when no other tensor has it)."""
        tensor = self.tensors[index]
        if tensor.name == name or name in self._used:
            return
        self._used.discard(tensor.name)
        self._used.add(name)
        tensor.name = name

    # ---- tensors
    def _add(
        self,
        name: str,
        spec_views: list[TensorSpec],
        data: np.ndarray | None,
        *,
        reserved_name: bool = False,
    ) -> int:
        shapes = [s.shape for s in spec_views]
        shape = shapes[0]
        if len(shapes) > 1 and len(shapes[1]) == len(shape):
            shape = tuple(a if a == b else DYNAMIC for a, b in zip(shape, shapes[1], strict=True))
        final = name if reserved_name and name not in self._used else self._fresh_name(name)
        if final == name:
            self._used.add(name)
        self.tensors.append(Tensor(name=final, dtype=spec_views[0].dtype, shape=shape, data=data))
        index = len(self.tensors) - 1
        for view, spec in zip(self.views, spec_views, strict=True):
            view[index] = spec
        return index

    def constant(self, name: str, value: Any, dtype: Any = None) -> int:
        """A constant tensor holding `value` (stored bit for bit)."""
        array = contiguous(np.asarray(value, dtype=dtype))
        array.flags.writeable = False
        spec = TensorSpec(array.shape, array.dtype, array)
        index = self._add(name, [spec] * len(self.views), array, reserved_name=True)
        self.static.add(index)
        return index

    def release_values(self, indices: Iterable[int]) -> None:
        """Forget the values folded here for tensors no later node reads (their specs keep
        shape, dtype and quantization): the outputs of lazily folded nodes, which the
        runtime computes at load, and the float copies of quantized constants. Tensors
        reused through `derived` or `centred` keep theirs."""
        kept = set(self._derived.values())
        kept.update(i for entry in self.centred.items() for i in (entry[0], *entry[1]))
        for index in indices:
            if index in kept or index not in self.static:
                continue
            if self.deferred.pop(index, None) is not None:
                self.static.discard(index)
                continue
            data = self.tensors[index].data
            for view in self.views:
                spec = view.get(index)
                if spec is not None and spec.value is not None and spec.value is not data:
                    view[index] = TensorSpec(spec.shape, spec.dtype, quant=spec.quant)
                    self.static.discard(index)

    def derived(self, key: tuple[Hashable, ...], make: Callable[[], int]) -> int:
        """The tensor `make()` adds, made once per `key`: a constant computed from another
        (a weight's transposed or scaled copy) is stored once however many nodes read it,
        as models that share a weight across layers need."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def quantized_constant(
        self, name: str, values: np.ndarray, quantization: Any, *, as_stored: bool = False
    ) -> int:
        """An integer constant with quantization that kernels see as its float32 value:
        the runtime dequantizes such weights once at load (weight-only quantization).
        With `as_stored`, for an input a kernel reads as stored (its `quantized_weights`),
        kernels see the integers and their parameters, and no float copy is made."""
        from sporenet.converter.quantize.params import dequantize

        array = contiguous(np.asarray(values))
        array.flags.writeable = False
        if as_stored:
            spec = TensorSpec(array.shape, array.dtype, array, quantization)
        else:
            real = dequantize(array, quantization)
            real.flags.writeable = False
            spec = TensorSpec(real.shape, real.dtype, real)
        index = self._add(name, [spec] * len(self.views), array)
        self.tensors[index].dtype = array.dtype
        self.tensors[index].quantization = quantization
        self.static.add(index)
        return index

    def graph_input(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        probes: Sequence[tuple[int, ...]] | None = None,
        dim_names: tuple[str, ...] = (),
    ) -> int:
        """A graph input of declared `shape` (-1: dynamic), seen at its probe shapes (one per
        view, lite/dims.py; by default this input's own)."""
        if probes is None:
            probes = [probe_shapes([(tuple(shape), dim_names)], k)[0] for k in (0, 1)]
        specs = [TensorSpec(tuple(p), dtype) for p in probes[: len(self.views)]]
        index = self._add(name, specs, None, reserved_name=True)
        self.tensors[index].shape = tuple(shape)
        self.tensors[index].dim_names = dim_names
        self.inputs.append(index)
        return index

    # ---- queries for handlers
    def spec(self, index: int) -> TensorSpec:
        return self.views[0][index]

    def shape(self, index: int) -> tuple[int, ...]:
        """Shape with -1 for dynamic dimensions."""
        return self.tensors[index].shape

    def rank(self, index: int) -> int:
        if index in self.opaque:  # planned at run time: its declared (all dynamic) shape
            return len(self.tensors[index].shape)
        return len(self.views[0][index].shape)

    def dtype(self, index: int) -> np.dtype:
        if index in self.opaque:
            return self.tensors[index].dtype
        return self.views[0][index].dtype

    def value(self, index: int) -> np.ndarray | None:
        """The tensor's value if it is the same whatever the dynamic dimensions are."""
        if index == -1 or index not in self.static:
            return None
        if index in self.deferred:
            self._force(index)
        return self.views[0][index].value

    def _force(self, index: int) -> None:
        """Compute a deferred tensor's value (and its node's other outputs'), its deferred
        inputs' first."""
        op, attrs, inputs, outputs = self.deferred[index]
        for i in inputs:
            if i in self.deferred:
                self._force(i)
        in_specs = [self.views[0][i] if i != -1 else None for i in inputs]
        kernel = prepare_kernel(op, attrs, in_specs, len(outputs))
        values = fold(kernel)
        if values is None:  # cannot happen for a node that was folded static
            raise self.fail(f"{op.name}: a deferred constant could not be computed")
        for out, value in zip(outputs, values, strict=False):
            if self.deferred.pop(out, None) is None:
                continue  # released meanwhile: no reader left
            value.flags.writeable = False
            for view in self.views:
                view[out] = TensorSpec(value.shape, value.dtype, value, view[out].quant)

    def static_input(self, node: OnnxNode, k: int, what: str) -> np.ndarray | None:
        """The value of `node`'s input k, which must be known at conversion time; None when
        the optional input is absent. A value that varies with a dynamic input dimension
        gets a hint to fix that dimension with --input-shape."""
        index = node.input(k)
        if index == -1:
            return None
        value = self.value(index)
        if value is None:
            hint = (
                "; it depends on a dynamic input dimension: fix that with --input-shape"
                if self.view_values(index) is not None
                else ""
            )
            raise node.fail(f"{what} (input {k}) must be static (known at conversion time){hint}")
        return value

    def fail(self, message: str) -> ConversionError:
        return ConversionError(f"{self.where}: {message}" if self.where else message)

    # ---- nodes
    def emit(
        self,
        op: OpCode,
        inputs: Sequence[int],
        *,
        num_outputs: int = 1,
        name: str = "",
        output_quant: Sequence[Quantization | None] = (),
        **attrs: Any,
    ) -> list[int]:
        """Add an IR node (or fold it into constants) and return its output tensor indices.
        `output_quant` declares the outputs' quantization (a QUANTIZE node's parameters);
        outputs whose kernel gives them quantization are never folded into constants."""
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.emitted.add(op)
        if op not in KERNELS:
            raise self.fail(f"needs the runtime op {op.name}, which has no kernel yet")
        if any(i in self.opaque for i in inputs):
            # a step of one ONNX op's translation after a node planned at run time
            return self._emit_opaque(op, inputs, num_outputs, name, attrs)
        inputs = self._float_first_input(op, inputs)
        kernels = self._prepare_deferred(op, attrs, inputs, num_outputs, output_quant)
        if kernels is None:  # a fed input's value the kernel cannot check yet
            return self._emit_opaque(op, inputs, num_outputs, name, attrs)
        base = name or f"{self.where or op.name.lower()}/{op.name.lower()}"
        names = [base if num_outputs == 1 else f"{base}:{k}" for k in range(num_outputs)]
        # A quantized output keeps its node: a constant here would lose its parameters.
        quantized = any(spec.quant is not None for spec in kernels[0].output_specs)
        out_bytes = sum(spec.size * spec.dtype.itemsize for spec in kernels[0].output_specs)
        if out_bytes > MAX_TENSOR_BYTES:
            raise self.fail(
                f"{op.name} would produce {out_bytes:,} bytes, more than the "
                f"{MAX_TENSOR_BYTES:,} a tensor may hold"
            )
        static = not quantized and all(i == -1 or i in self.static for i in inputs)
        if static and self._defers(inputs, out_bytes):
            return self._emit_deferred(op, attrs, inputs, num_outputs, names, kernels)
        if static and any(i in self.deferred for i in inputs):
            self._force_all(inputs)  # folded now: the kernel needs its inputs' values
            kernels = self._prepare_views(op, attrs, inputs, num_outputs, output_quant) or kernels
        folded = fold(kernels[0]) if static else None
        lazy = None
        if folded is not None:
            outs = folded[:num_outputs]
            # Only inputs stored in the file count: a result computed from fills the runtime
            # folds at load time would otherwise be stored in full.
            stored = [self.tensors[i].data for i in inputs if i != -1]
            in_bytes = sum(d.nbytes for d in stored if d is not None)
            if all(should_materialize(o.nbytes, in_bytes) for o in outs):
                return [self.constant(n, o) for n, o in zip(names, outs, strict=False)]
            lazy = outs
        per_view = None if lazy is not None or quantized else self._per_view_values(kernels, inputs)
        if per_view is not None and all(
            a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
            for a, b in zip(per_view[0], per_view[1], strict=True)
        ):
            # The same whatever the dynamic dimensions are (e.g. a static part of Shape(x)).
            return [self.constant(n, o) for n, o in zip(names, per_view[0], strict=False)]
        outputs = self._add_outputs(kernels, inputs, names, lazy, per_view)
        self._append_node(op, attrs, inputs, outputs)
        return outputs

    def _force_all(self, inputs: Sequence[int]) -> None:
        for i in inputs:
            if i in self.deferred:
                self._force(i)

    def _prepare_deferred(
        self,
        op: OpCode,
        attrs: dict[str, Any],
        inputs: Sequence[int],
        num_outputs: int,
        output_quant: Sequence[Quantization | None],
    ) -> list[Kernel] | None:
        """`_prepare_views`, with deferred inputs left without values where the kernel
        prepares without them (a Gather of a deferred table by ids fed at run time), and
        computed where it does not."""
        if not any(i in self.deferred for i in inputs):
            return self._prepare_views(op, attrs, inputs, num_outputs, output_quant)
        try:
            return self._prepare_views(op, attrs, inputs, num_outputs, output_quant)
        except ConversionError:
            self._force_all(inputs)
            return self._prepare_views(op, attrs, inputs, num_outputs, output_quant)

    def _defers(self, inputs: Sequence[int], out_bytes: int) -> bool:
        """Whether a static node's outputs are deferred (`deferred`): large, and more than
        the stored constants they are computed from (the node is kept for the runtime)."""
        if out_bytes < DEFERRED_BYTES:
            return False
        stored = [self.tensors[i].data for i in inputs if i != -1]
        return not should_materialize(out_bytes, sum(d.nbytes for d in stored if d is not None))

    def _emit_deferred(
        self,
        op: OpCode,
        attrs: dict[str, Any],
        inputs: Sequence[int],
        num_outputs: int,
        names: list[str],
        kernels: list[Kernel],
    ) -> list[int]:
        """The node, its outputs static with their values deferred."""
        outputs = self._add_outputs(kernels, inputs, names, None, None)
        for out in outputs:
            self.static.add(out)
            self.deferred[out] = (op, attrs, list(inputs), outputs)
        self._append_node(op, attrs, inputs, outputs)
        return outputs

    def _float_first_input(self, op: OpCode, inputs: Sequence[int]) -> Sequence[int]:
        """`inputs` with a weight-only quantized constant in first place (a DequantizeLinear
        of an integer constant, which this import computes with as its float value) given
        as that float value. The runtime picks a node's int8 kernel by its first input, so
        a data-movement op on the integers (the Unsqueeze and Slice of a T5 decoder's
        relative position bias, folded to a constant when the input shapes are fixed) would
        hand quantized values to the float ops after it."""
        if not inputs or inputs[0] == -1 or op not in QUANTIZED_KERNELS:
            return inputs
        first = inputs[0]
        tensor, spec = self.tensors[first], self.views[0].get(first)
        if tensor.quantization is None or spec is None or spec.quant is not None:
            return inputs  # not quantized, or a kernel reads the integers as stored
        if spec.value is None or spec.dtype == tensor.dtype:
            return inputs
        value = spec.value
        as_float = self.derived(
            ("float value", first), lambda: self.constant(f"{tensor.name}/float", value)
        )
        return [as_float, *inputs[1:]]

    def _prepare_views(
        self,
        op: OpCode,
        attrs: dict[str, Any],
        inputs: Sequence[int],
        num_outputs: int,
        output_quant: Sequence[Quantization | None],
    ) -> list[Kernel] | None:
        """The node's kernel prepared once per view of the dynamic dimensions; None when a
        fed input's value makes it fail (the node is then planned at run time)."""
        kernels = []
        for view in self.views:
            in_specs = [view[i] if i != -1 else None for i in inputs]
            try:
                kernels.append(
                    prepare_kernel(op, attrs, in_specs, num_outputs, output_quant=output_quant)
                )
            except (ShapeError, UnsupportedOpError) as exc:
                if any(i in self.fed for i in inputs):
                    return None
                raise self.fail(str(exc)) from None
        return kernels

    def _add_outputs(
        self,
        kernels: list[Kernel],
        inputs: Sequence[int],
        names: list[str],
        lazy: list[np.ndarray] | None,
        per_view: list[list[np.ndarray]] | None,
    ) -> list[int]:
        """The node's output tensors, with a spec per view: the kernels' (their
        quantization included), the folded values kept `lazy` (computed at load), or the
        values each view computes."""
        outputs = []
        fed = any(i in self.fed for i in inputs) and all(
            i == -1 or i in self.fed or i in self.static for i in inputs
        )
        for k, name in enumerate(names):
            specs = [
                TensorSpec(
                    kr.output_specs[k].shape,
                    kr.output_specs[k].dtype,
                    quant=kr.output_specs[k].quant,
                )
                for kr in kernels
            ]
            if lazy is not None:
                specs = [TensorSpec(lazy[k].shape, lazy[k].dtype, lazy[k])] * len(self.views)
            elif per_view is not None:
                specs = [TensorSpec(v[k].shape, v[k].dtype, v[k]) for v in per_view]
            index = self._add(name, specs, None)
            self.tensors[index].quantization = specs[0].quant
            if lazy is not None:
                self.static.add(index)
            if fed:
                self.fed.add(index)
            outputs.append(index)
        return outputs

    def _emit_opaque(
        self, op: OpCode, inputs: Sequence[int], num_outputs: int, name: str, attrs: dict
    ) -> list[int]:
        """A node whose output shapes depend on a value fed at run time (Reshape to a shape
        input): its outputs have no spec here (the runtime plans them once it has the
        value), so only a graph output may use them. Their stored shape is all dynamic,
        of the data input's rank, and their dtype the data input's."""
        data = inputs[0]
        dtype = self.tensors[data].dtype
        rank = max(len(self.tensors[data].shape), 1)
        stand_in = self._stand_in_outputs(op, inputs, num_outputs, attrs)
        base = name or f"{self.where or op.name.lower()}/{op.name.lower()}"
        outputs = []
        for k in range(num_outputs):
            final = self._fresh_name(base if num_outputs == 1 else f"{base}:{k}")
            self._used.add(final)
            if stand_in is not None:
                dtype, rank = stand_in[k].dtype, stand_in[k].rank
            self.tensors.append(Tensor(name=final, dtype=dtype, shape=(DYNAMIC,) * rank))
            outputs.append(len(self.tensors) - 1)
        self.opaque.update(outputs)
        self.nodes.append(Node(op=op, inputs=list(inputs), outputs=outputs, attrs=attrs, name=base))
        return outputs

    def _stand_in_outputs(
        self, op: OpCode, inputs: Sequence[int], num_outputs: int, attrs: dict
    ) -> list[TensorSpec] | None:
        """The output dtypes and ranks of a node planned at run time, from its kernel
        prepared on size-1 stand-ins for the inputs without a spec (None if it refuses)."""
        specs: list[TensorSpec | None] = []
        for i in inputs:
            if i == -1:
                specs.append(None)
            elif i in self.opaque:
                t = self.tensors[i]
                specs.append(TensorSpec((1,) * len(t.shape), t.dtype))
            else:
                specs.append(self.views[0][i])
        try:
            kernel = prepare_kernel(op, attrs, specs, num_outputs)
        except (LiteError, ArithmeticError, LookupError, TypeError, ValueError):
            return None
        outs = kernel.output_specs[:num_outputs]
        return outs if len(outs) == num_outputs else None

    def _per_view_values(
        self,
        kernels: list[Kernel],
        inputs: Sequence[int],
    ) -> list[list[np.ndarray]] | None:
        """Outputs under each assignment of the dynamic dimensions, when every input has a
        value under each (shape arithmetic on a dynamic batch: Shape -> Gather -> Concat)."""
        if len(self.views) < 2:
            return None
        results = []
        for view, kernel in zip(self.views, kernels, strict=True):
            values = [view[i].value if i != -1 else None for i in inputs]
            if any(v is None for i, v in zip(inputs, values, strict=True) if i != -1):
                return None
            if max((v.size for v in values if v is not None), default=0) > 64:
                return None  # only small shape-like tensors are worth tracking
            outs = fold(kernel)
            if outs is None:
                return None
            results.append(outs)
        return results

    def view_values(self, index: int) -> list[np.ndarray] | None:
        """A tensor's value under each assignment of the dynamic dimensions, if known."""
        if index in self.deferred:
            self._force(index)
        values = [v for view in self.views if (v := view[index].value) is not None]
        return values if len(values) == len(self.views) else None

    def set_view_values(self, index: int, values: Sequence[np.ndarray]) -> None:
        for view, value in zip(self.views, values, strict=True):
            view[index] = TensorSpec(value.shape, value.dtype, value)

    def emit1(self, op: OpCode, inputs: Sequence[int], **attrs: Any) -> int:
        return self.emit(op, inputs, **attrs)[0]

    # ---- result
    def build(self, outputs: dict[str, int], *, producer: str, description: str) -> Model:
        graph = Graph(
            name="main",
            inputs=list(self.inputs),
            outputs=list(outputs.values()),
            nodes=list(self.nodes),
        )
        signature = Signature(
            key="infer",
            graph=0,
            inputs={self.tensors[i].name: i for i in self.inputs},
            outputs=dict(outputs),
        )
        return Model(
            tensors=self.tensors,
            graphs=[graph, *self.subgraphs],
            signatures={"infer": signature},
            metadata=dict(self.metadata),
            producer=producer,
            description=description,
        )
