"""The tape: every op a model runs is recorded as a node of an IR graph (ModelBuilder).

In eager mode the tape also runs each op at once with `lite.eager.run_op` and keeps the
values, so any intermediate can be inspected and the backward nodes that
`lite.autodiff.append_gradients` adds can be run the same way. In tracing mode (graph
mode) the tape only records: the result is the IR graph the planner runs.

Layers see only `Var`s: a tensor index on the tape plus, in eager mode, its value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sporenet.cloud.errors import TraceError
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.eager import run_op
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import DYNAMIC, Model
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
        other_var = (
            other
            if isinstance(other, Var)
            else self.tape.constant(f"{op.name.lower()}_const", np.asarray(other, np.float32))
        )
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

    def constant(self, name: str, value: np.ndarray) -> Var:
        """A non-trainable constant (scale factors, shapes)."""
        index = self.builder.constant(name, value)
        data = self.builder.tensors[index].data
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
                self.values[index] = self.builder.tensors[index].data
        index = self.params[key]
        return Var(self, index, self.values.get(index))

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
        if self.eager:
            arrays = [None if v is None else self.values[v.index] for v in inputs]
            try:
                results = run_op(op, arrays, num_outputs=num_outputs, **attrs)
            except LiteError as exc:
                raise TraceError(f"{op.name} failed in eager mode: {exc}") from exc
            for i, value in zip(outs, results, strict=True):
                self.set_value(i, value)
        result = [Var(self, i, self.values.get(i)) for i in outs]
        return result if num_outputs > 1 else result[0]

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


def batch_shape(sample_shape: Sequence[int]) -> tuple[int, ...]:
    """The traced input shape for samples of `sample_shape`: a dynamic batch first."""
    return (DYNAMIC, *(int(d) for d in sample_shape))
