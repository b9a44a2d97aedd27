"""The tape: every op a model runs is recorded as a node of an IR graph (ModelBuilder).

In eager mode the tape also runs each op at once with `lite.eager.run_op` and keeps the
values, so any intermediate can be inspected and the backward nodes that
`lite.autodiff.append_gradients` adds can be run the same way. In tracing mode (graph
mode) the tape only records: the result is the IR graph the planner runs.

Layers see only `Var`s: a tensor index on the tape plus, in eager mode, its value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from sporenet.cloud.errors import TraceError
from sporenet.lite.builder import ModelBuilder, fill_inferred_shapes
from sporenet.lite.dims import batch_names
from sporenet.lite.eager import run_op
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Graph, Model, Node
from sporenet.lite.kernels.control_flow import SUBGRAPH_ATTRIBUTES
from sporenet.lite.ops import OpCode

if TYPE_CHECKING:
    from sporenet.cloud.module import Parameter


class Var:
    """A tensor flowing through a model: its index on a tape and (eager) its value."""

    __slots__ = ("index", "tape", "value")
    __array_priority__ = 100  # so ndarray + Var defers to Var.__radd__

    def __init__(self, tape: Tape, index: int, value: np.ndarray | None) -> None:
        self.tape = tape
        self.index = index
        self.value = value

    # ---- inspection
    @property
    def name(self) -> str:
        return self.tape.builder.tensors[self.index].name

    @property
    def shape(self) -> tuple[int, ...]:
        if self.value is not None:
            return tuple(self.value.shape)
        return tuple(self.tape.builder.tensors[self.index].shape)

    def numpy(self) -> np.ndarray:
        """The value (eager mode only)."""
        if self.value is None:
            raise TraceError(
                f"tensor {self.name!r} has no value while tracing; values exist in eager mode"
            )
        return self.value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"Var({self.name!r}, shape={self.shape})"

    # ---- arithmetic: recorded as ADD/SUB/MUL/DIV nodes
    def _binary(self, op: OpCode, other: Any, reverse: bool = False) -> Var:
        if isinstance(other, Var):
            other_var = other
        else:  # a number takes this Var's float dtype (float32 for integer Vars)
            dtype = self.tape.builder.tensors[self.index].dtype
            dtype = dtype if dtype.kind == "f" else np.dtype(np.float32)
            value = np.asarray(other, dtype)
            other_var = self.tape.constant(f"{op.name.lower()}_const", value, keep_dtype=True)
        a, b = (other_var, self) if reverse else (self, other_var)
        return self.tape.op(op, [a, b])

    def __add__(self, other: Any) -> Var:
        return self._binary(OpCode.ADD, other)

    def __radd__(self, other: Any) -> Var:
        return self._binary(OpCode.ADD, other, reverse=True)

    def __sub__(self, other: Any) -> Var:
        return self._binary(OpCode.SUB, other)

    def __rsub__(self, other: Any) -> Var:
        return self._binary(OpCode.SUB, other, reverse=True)

    def __mul__(self, other: Any) -> Var:
        return self._binary(OpCode.MUL, other)

    def __rmul__(self, other: Any) -> Var:
        return self._binary(OpCode.MUL, other, reverse=True)

    def __truediv__(self, other: Any) -> Var:
        return self._binary(OpCode.DIV, other)

    def __rtruediv__(self, other: Any) -> Var:
        return self._binary(OpCode.DIV, other, reverse=True)

    def __neg__(self) -> Var:
        return self.tape.op(OpCode.NEG, [self])

    def flatten(self, axis: int = 1) -> Var:
        return self.tape.op(OpCode.FLATTEN, [self], axis=axis)

    def reshape(self, *shape: Any) -> Var:
        """x.reshape(2, -1) or x.reshape((2, -1)); 0 keeps that input dimension."""
        dims = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple | list) else shape
        return self.tape.op(OpCode.RESHAPE, [self], shape=[int(d) for d in dims])


class Tape:
    """Records ops into a ModelBuilder; with `eager=True` also runs them at once."""

    def __init__(
        self, *, eager: bool, training: bool = False, names: dict[int, str] | None = None
    ) -> None:
        self.eager = eager
        self.training = training
        self.step = 0  # the optimizer step an eager training tape records (seeds dropout)
        # Keep inference-mode Dropout nodes (graph mode turns them on); export drops them.
        self.keep_dropout = False
        self.builder = ModelBuilder(producer="sporenet.cloud")
        self.values: dict[int, np.ndarray] = {}
        # Parameter object id -> tensor index, so a shared parameter is one tensor.
        self.params: dict[int, int] = {}
        self.param_objects: dict[int, Parameter] = {}
        # Parameter object id -> its path in the model ("features.0.weight").
        self.names = names or {}
        # Subgraphs being recorded (innermost last); ops go to the innermost one.
        self.scopes: list[Scope] = []
        self._inferred = 0  # tensors below this index carry inferred shapes (tracing)

    # ---- leaves
    def input(
        self,
        name: str,
        value: np.ndarray | None = None,
        *,
        shape: Sequence[int] | None = None,
        dtype: Any = np.float32,
    ) -> Var:
        """A graph input: in eager mode pass its value; when tracing, its shape (-1: batch)."""
        if self.eager:
            if value is None:
                raise TraceError(f"eager input {name!r} needs a value")
            value = np.asarray(value)
            index = self.builder.input(name, value.shape, value.dtype)
            self.values[index] = value
            return Var(self, index, value)
        if shape is None:
            raise TraceError(f"traced input {name!r} needs a shape")
        return Var(self, self.builder.input(name, shape, dtype), None)

    def constant(self, name: str, value: ArrayLike, *, keep_dtype: bool = False) -> Var:
        """A non-trainable constant (scale factors, shapes); float64 values become float32
        unless `keep_dtype`."""
        value = np.asarray(value)
        index = self.builder.constant(name, value, value.dtype if keep_dtype else None)
        data = self._constant_data(index)
        if self.eager:
            self.values[index] = data
        return Var(self, index, data if self.eager else None)

    def param(self, p: Parameter, *, trainable: bool | None = None) -> Var:
        """The tensor of a parameter or buffer (one tensor per object per tape)."""
        key = id(p)
        if key not in self.params:
            name = self.names.get(key, "param")
            index = self.builder.constant(
                name, p.value, trainable=p.trainable if trainable is None else trainable
            )
            self.params[key] = index
            self.param_objects[key] = p
            if self.eager:
                self.values[index] = self._constant_data(index)
        index = self.params[key]
        return Var(self, index, self.values.get(index))

    def _constant_data(self, index: int) -> np.ndarray:
        """The value the builder stored for constant `index` (cast as the tensor's dtype)."""
        data = self.builder.tensors[index].data
        if data is None:
            raise TraceError(f"tensor {self.builder.tensors[index].name!r} is not a constant")
        return data

    # ---- ops
    def op(
        self,
        op: OpCode,
        inputs: Sequence[Var | None],
        *,
        num_outputs: int = 1,
        name: str | None = None,
        **attrs: Any,
    ) -> Any:
        """Record (and in eager mode run) one node; returns a Var, or a list if num_outputs > 1."""
        indices = []
        for v in inputs:
            if v is not None and v.tape is not self:
                raise TraceError(f"{op.name}: input {v.name!r} belongs to another tape")
            indices.append(-1 if v is None else v.index)
        outs = self.builder.op_multi(op, indices, num_outputs, name=name, **attrs)
        if not self.eager and indices and indices[0] != -1:
            # Until shapes are inferred, an output is taken to have its first input's float
            # dtype (so numbers combined with it match it); inference corrects the rest.
            dtype = self.builder.tensors[indices[0]].dtype
            for i in outs:
                if dtype.kind == "f":
                    self.builder.tensors[i].dtype = dtype
        if self.eager:
            arrays = [None if v is None else self.values[v.index] for v in inputs]
            try:
                results = self._run(op, arrays, num_outputs, attrs)
            except LiteError as exc:
                raise TraceError(f"{op.name} failed in eager mode: {exc}") from exc
            for i, value in zip(outs, results, strict=True):
                self.set_value(i, value)
        result = [Var(self, i, self.values.get(i)) for i in outs]
        return result if num_outputs > 1 else result[0]

    def _run(
        self, op: OpCode, arrays: list[np.ndarray | None], num_outputs: int, attrs: dict
    ) -> list[np.ndarray]:
        """Run one op now; control-flow ops plan their subgraphs from the tape's model."""
        model = self.live_model() if op in SUBGRAPH_ATTRIBUTES else None
        return run_op(op, arrays, num_outputs=num_outputs, model=model, **attrs)

    def run_nodes(self, nodes: Sequence[Node]) -> None:
        """Run nodes appended to the tape from outside (the autodiff engine's backward
        nodes) in eager mode, storing their values and concrete shapes."""
        tensors = self.builder.tensors
        for node in nodes:
            arrays = [
                None if i == -1 else self.values[i] if i in self.values else tensors[i].data
                for i in node.inputs
            ]
            try:
                results = self._run(node.op, arrays, len(node.outputs), node.attrs)
            except LiteError as exc:
                raise TraceError(f"{node.op.name} failed in eager mode: {exc}") from exc
            for i, value in zip(node.outputs, results, strict=True):
                self.set_value(i, value)

    # ---- the graph recorded so far, and subgraphs
    def live_model(self) -> Model:
        """The graph being recorded (the innermost subgraph scope, else the main graph) as
        graph 0 of a Model that shares this tape's tensor table and node list, so the
        autodiff engine appends to the tape in place. Call `adopt` after."""
        b = self.builder
        inputs = self.scopes[-1].inputs if self.scopes else b.inputs
        graph = Graph(name="live", inputs=inputs, outputs=[], nodes=b.nodes)
        return Model(tensors=b.tensors, graphs=[graph, *b.subgraphs], producer=b.producer)

    def adopt(self, model: Model) -> None:
        """Take what the autodiff engine added to a `live_model`: its tensors' names (the
        table is shared) and the subgraphs its rules appended."""
        self.builder.adopt_names()
        self.builder.subgraphs.extend(model.graphs[1 + len(self.builder.subgraphs) :])

    def infer_shapes(self) -> None:
        """Give the tensors recorded so far their inferred shapes and dtypes (tracing only:
        eager values carry theirs). Subgraph inputs take their shapes from these."""
        if self.eager:
            return
        try:
            fill_inferred_shapes(self.live_model(), 0)
        except LiteError as exc:
            raise TraceError(f"the traced graph is invalid: {exc}") from exc

    def spec(self, var: Var) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype of a Var (tracing: inferred for the graph recorded so far, once
        per tensor recorded since the last inference)."""
        t = self.builder.tensors[var.index]
        if not self.eager and var.index >= self._inferred and t.data is None:
            self.infer_shapes()
            self._inferred = len(self.builder.tensors)
            t = self.builder.tensors[var.index]
        return tuple(t.shape), t.dtype

    @contextmanager
    def recording(self, inputs: list[int]) -> Iterator[Scope]:
        """Within the block, ops are recorded into a new scope with graph inputs `inputs`."""
        scope = Scope(inputs=inputs, nodes=[])
        saved = self.builder.nodes
        self.builder.nodes = scope.nodes
        self.scopes.append(scope)
        try:
            yield scope
        finally:
            self.scopes.pop()
            self.builder.nodes = saved

    def fresh(self, name: str, like: Var | None = None, **spec: Any) -> Var:
        """A new tensor for a subgraph input: shaped like `like` (and holding its eager
        value), or of `shape` and `dtype`, with `value` in eager mode."""
        if like is not None:
            shape, dtype = self.spec(like)
            value = like.value
        else:
            shape, dtype, value = spec["shape"], np.dtype(spec["dtype"]), spec.get("value")
        index = self.builder.tensor(name, shape, dtype)
        if DYNAMIC in shape:
            names = self.builder.tensors[like.index].dim_names if like is not None else ()
            self.builder.tensors[index].dim_names = batch_names(shape, names)
        if self.eager and value is not None:
            self.values[index] = value
        return Var(self, index, value)

    def subgraph(self, name: str, fn: Callable[..., Any], leading: Sequence[Var]) -> SubgraphRecord:
        """Record `fn(*leading)` as a subgraph whose first inputs are `leading` (fresh
        tensors made with `fresh`). Values it reads from outside (the enclosing graph's
        tensors, trainable parameters) become its captures: trailing graph inputs that
        the caller passes as the node's implicit inputs (`finish` adds them)."""
        self.infer_shapes()
        inputs = [v.index for v in leading]
        with self.recording(inputs) as scope:
            result = fn(*leading)
            outs, single = as_vars(result, name)
            produced = set(inputs)
            for node in scope.nodes:
                produced.update(node.outputs)
            # Every output comes from a node of this graph (a graph output that is one of
            # its inputs or a capture would be a value the node did not compute).
            outs = [
                v
                if v.index in produced and v.index not in inputs
                else self.op(OpCode.IDENTITY, [v])
                for v in outs
            ]
        captures: dict[int, int] = {}
        local = set(inputs)
        for node in scope.nodes:
            for k, i in enumerate(node.inputs):
                if i == -1 or i in local:
                    continue
                t = self.builder.tensors[i]
                if t.data is not None and not t.trainable:
                    continue  # a constant: subgraphs read constants directly
                if i not in captures:
                    outer = Var(self, i, self.values.get(i))
                    captures[i] = self.fresh(f"{name}/capture", outer).index
                node.inputs[k] = captures[i]
            local.update(node.outputs)
        return SubgraphRecord(name, inputs, scope.nodes, outs, single, captures)

    def finish(self, record: SubgraphRecord, implicit: Sequence[int]) -> int:
        """Add a recorded subgraph with trailing inputs for the outer tensors `implicit`
        (a superset of its captures: branches of one IF share their implicit inputs);
        returns its graph index."""
        tail = []
        for i in implicit:
            if i in record.captures:
                tail.append(record.captures[i])
            else:  # captured by a sibling branch only
                tail.append(
                    self.fresh(f"{record.name}/unused", Var(self, i, self.values.get(i))).index
                )
        graph = Graph(
            name=record.name,
            inputs=[*record.inputs, *tail],
            outputs=[v.index for v in record.outputs],
            nodes=record.nodes,
        )
        index = self.builder.subgraph(graph)
        if not self.eager:
            probe = Model(tensors=self.builder.tensors, graphs=[graph, *self.builder.subgraphs])
            try:
                fill_inferred_shapes(probe, 0)
            except LiteError as exc:
                raise TraceError(f"subgraph {record.name!r} is invalid: {exc}") from exc
        return index

    def set_value(self, index: int, value: np.ndarray) -> None:
        """Store an eager value and give the tensor-table entry its concrete shape."""
        self.values[index] = value
        t = self.builder.tensors[index]
        self.builder.tensors[index] = dataclasses.replace(
            t, shape=tuple(value.shape), dtype=value.dtype
        )

    # ---- results
    def model(self, outputs: Sequence[tuple[Var, str]]) -> Model:
        """The recorded graph as a Model with the given named outputs."""
        for var, out_name in outputs:
            self.builder.output(var.index, out_name)
        try:
            # Eager tapes already carry concrete shapes; traced ones get them inferred.
            return self.builder.build(infer_shapes=not self.eager)
        except LiteError as exc:
            raise TraceError(f"the traced graph is invalid: {exc}") from exc


@dataclasses.dataclass
class Scope:
    """A subgraph being recorded: its graph inputs and the nodes recorded into it."""

    inputs: list[int]
    nodes: list[Node]


@dataclasses.dataclass
class SubgraphRecord:
    """A recorded subgraph before it joins the model (Tape.subgraph, Tape.finish)."""

    name: str
    inputs: list[int]
    nodes: list[Node]
    outputs: list[Var]
    single: bool  # fn returned one Var, not a tuple
    captures: dict[int, int]  # outer tensor -> the subgraph input standing for it


def as_vars(result: Any, what: str) -> tuple[list[Var], bool]:
    """A function's result as a list of Vars, and whether it was a single Var."""
    if isinstance(result, Var):
        return [result], True
    if isinstance(result, tuple | list) and result and all(isinstance(v, Var) for v in result):
        return list(result), False
    raise TraceError(f"{what} must return a Var or a tuple of Vars, got {type(result).__name__}")


def batch_shape(sample_shape: Sequence[int]) -> tuple[int, ...]:
    """The traced input shape for samples of `sample_shape`: a dynamic batch first."""
    return (DYNAMIC, *(int(d) for d in sample_shape))
