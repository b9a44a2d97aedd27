"""A small programmatic model builder, used by tests, examples, the converter and cloud export.

    b = ModelBuilder()
    x = b.input("x", (-1, 64))
    w = b.constant("fc1.weight", np.zeros((128, 64), np.float32), trainable=True)
    y = b.op(OpCode.FULLY_CONNECTED, [x, w], activation="relu")
    b.output(y, name="logits")
    model = b.build()

Tensors are referred to by index; `op` returns the index of its (first) output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sporenet.lite.errors import ShapeError
from sporenet.lite.graph import DYNAMIC, Graph, Model, Node, Quantization, Signature, Tensor
from sporenet.lite.ops import OpCode
from sporenet.lite.validate import validate

if TYPE_CHECKING:
    from sporenet.lite.kernels.base import TensorSpec


def unique_name(
    name: str, taken: set[str], *, reserved: Container[str] = (), sep: str = "_"
) -> str:
    """`name`, or `name{sep}1`, `name{sep}2`, ...: the first in neither `taken` nor
    `reserved`; it joins `taken`."""
    candidate, k = name, 1
    while candidate in taken or candidate in reserved:
        candidate = f"{name}{sep}{k}"
        k += 1
    taken.add(candidate)
    return candidate


class ModelBuilder:
    """Accumulates tensors and nodes of one graph, then builds a validated Model."""

    def __init__(self, *, producer: str = "sporenet", description: str = "") -> None:
        self.tensors: list[Tensor] = []
        self.nodes: list[Node] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.output_names: list[str] = []
        self.metadata: dict[str, str] = {}
        # Graphs 1, 2, ... of the model: the subgraphs control-flow nodes name by index.
        self.subgraphs: list[Graph] = []
        self.producer = producer
        self.description = description
        self._names: set[str] = set()

    def _unique(self, name: str) -> str:
        return unique_name(name, self._names)

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: Any = np.float32,
        *,
        data: np.ndarray | None = None,
        trainable: bool = False,
        quantization: Quantization | None = None,
    ) -> int:
        """Add a tensor-table entry and return its index."""
        self.tensors.append(
            Tensor(
                name=self._unique(name),
                dtype=np.dtype(dtype),
                shape=tuple(int(d) for d in shape),
                data=data,
                trainable=trainable,
                quantization=quantization,
            )
        )
        return len(self.tensors) - 1

    def input(self, name: str, shape: Sequence[int], dtype: Any = np.float32) -> int:
        """A graph input; use -1 for a dynamic dimension."""
        index = self.tensor(name, shape, dtype)
        self.inputs.append(index)
        return index

    def constant(
        self,
        name: str,
        value: Any,
        dtype: Any = None,
        *,
        trainable: bool = False,
        quantization: Quantization | None = None,
    ) -> int:
        """A constant tensor holding `value` (stored contiguously in the model file)."""
        # asarray, not ascontiguousarray (which turns a 0-d value into shape (1,)); like it,
        # asarray does not copy a contiguous array, which cloud's eager tape relies on.
        array = np.asarray(value, dtype=dtype, order="C")
        if array.dtype == np.float64 and dtype is None:
            array = array.astype(np.float32)
        return self.tensor(
            name,
            array.shape,
            array.dtype,
            data=array,
            trainable=trainable,
            quantization=quantization,
        )

    def op(
        self,
        op: OpCode,
        inputs: Sequence[int],
        *,
        num_outputs: int = 1,
        name: str | None = None,
        version: int = 1,
        **attrs: Any,
    ) -> int:
        """Add a node; its outputs get fresh tensors whose shapes the planner infers."""
        base = name or f"{op.name.lower()}_{len(self.nodes)}"
        outputs = [
            self.tensor(f"{base}:{k}" if num_outputs > 1 else base, ()) for k in range(num_outputs)
        ]
        self.nodes.append(
            Node(
                op=op,
                inputs=list(inputs),
                outputs=outputs,
                attrs=dict(attrs),
                version=version,
                name=base,
            )
        )
        return outputs[0]

    def op_multi(
        self, op: OpCode, inputs: Sequence[int], num_outputs: int, **kwargs: Any
    ) -> list[int]:
        """Like `op` for nodes with several outputs; returns all output indices."""
        first = self.op(op, inputs, num_outputs=num_outputs, **kwargs)
        return list(range(first, first + num_outputs))

    def quantize(
        self, index: int, scale: Any, zero_point: Any = 0, axis: int = 0, dtype: Any = None
    ) -> int:
        """Give tensor `index` affine quantization parameters (and optionally a dtype, e.g.
        the int8 output of a quantized op); returns `index`."""
        scale = np.atleast_1d(np.asarray(scale, np.float32))
        zp = np.broadcast_to(np.asarray(zero_point, np.int64), scale.shape).copy()
        t = self.tensors[index]
        self.tensors[index] = dataclasses.replace(
            t,
            quantization=Quantization(scale=scale, zero_point=zp, axis=axis),
            dtype=np.dtype(dtype) if dtype is not None else t.dtype,
        )
        return index

    def adopt_names(self) -> None:
        """Reserve the names of tensors appended to the table from outside the builder
        (the autodiff engine appends to a model that shares this table)."""
        self._names.update(t.name for t in self.tensors)

    def subgraph(self, graph: Graph) -> int:
        """Add a subgraph (its tensors are entries of this builder's table); returns the
        graph index a control-flow node names it by."""
        self.subgraphs.append(graph)
        return len(self.subgraphs)

    def output(self, index: int, name: str | None = None) -> int:
        """Mark a tensor as a graph output, optionally under a user-facing name."""
        self.outputs.append(index)
        self.output_names.append(name or self.tensors[index].name)
        return index

    def build(self, *, graph_name: str = "main", infer_shapes: bool = True) -> Model:
        """The validated model with one graph and an "infer" signature.

        With `infer_shapes`, intermediate tensors get the shapes the planner infers
        (dimensions that follow a dynamic input dimension are stored as -1).
        """
        graph = Graph(
            name=graph_name,
            inputs=list(self.inputs),
            outputs=list(self.outputs),
            nodes=list(self.nodes),
        )
        signature = Signature(
            key="infer",
            graph=0,
            inputs={self.tensors[i].name: i for i in self.inputs},
            outputs=dict(zip(self.output_names, self.outputs, strict=True)),
        )
        model = Model(
            tensors=list(self.tensors),
            graphs=[graph, *self.subgraphs],
            signatures={"infer": signature},
            metadata=dict(self.metadata),
            producer=self.producer,
            description=self.description,
        )
        validate(model)
        if infer_shapes:
            fill_inferred_shapes(model)
        return model


SHAPES_FOLD_BYTES = 1 << 22
"""Shape inference computes no folded value larger than this (a weight the runtime
dequantizes at load), unless a kernel needs it to know its outputs."""


def _infer_probes(
    model: Model, graph_index: int, probes: list[dict[int, tuple[int, ...]]], dynamic: bool
) -> tuple[dict[int, TensorSpec], dict[int, TensorSpec]]:
    """The specs of every tensor under the first probe and, for a dynamic graph, the
    second: without computing large folded values first, with them if a kernel needs
    them (its ShapeError then comes from the second attempt)."""
    from sporenet.lite.planner import infer

    results = []
    for k in (0, 1) if dynamic else (0,):
        try:
            specs, _, _ = infer(
                model, graph_index, probes[k], shapes_only=True, fold_limit=SHAPES_FOLD_BYTES
            )
        except ShapeError:
            specs, _, _ = infer(model, graph_index, probes[k], shapes_only=True)
        results.append(specs)
    return results[0], results[-1]


def fill_inferred_shapes(model: Model, graph_index: int = 0) -> None:
    """Store inferred shapes on a graph's non-constant tensors, in place.

    Inference runs under the two probe assignments of the dynamic input dimensions
    (lite/dims.py); a dimension that differs between the two depends on a dynamic one and
    is stored as -1, named when it follows a named input dimension.
    """
    from sporenet.lite.dims import (
        PROBE_FAMILIES,
        graph_input_dims,
        inner_dim_names,
        is_dynamic,
        named_pairs,
        probe_shapes,
        value_input_candidates,
    )

    graph = model.graphs[graph_index]
    dims = graph_input_dims(model, graph_index)
    families = range(len(PROBE_FAMILIES)) if is_dynamic(dims) else range(1)
    error: ShapeError | None = None
    for family in families:
        probes = [
            dict(zip(graph.inputs, probe_shapes(dims, k, family), strict=True)) for k in (0, 1)
        ]
        try:
            first, second = _infer_probes(model, graph_index, probes, is_dynamic(dims))
            break
        except ShapeError as exc:
            error = error or exc
    else:
        if value_input_candidates(model, graph_index):
            return  # shapes follow values fed at run time: the planner infers them then
        raise error  # type: ignore[misc]
    named = named_pairs(dims, family)
    for node in graph.nodes:
        for i in node.outputs:
            a, b = first[i].shape, second[i].shape
            shape = tuple(x if x == y else DYNAMIC for x, y in zip(a, b, strict=False))
            if len(a) != len(b):
                shape = a
            quant = model.tensors[i].quantization or first[i].quant
            model.tensors[i] = dataclasses.replace(
                model.tensors[i],
                shape=shape,
                dtype=first[i].dtype,
                quantization=quant,
                dim_names=inner_dim_names(a, b, named),
            )
