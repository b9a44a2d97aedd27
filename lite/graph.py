"""The in-memory model IR: tensors, nodes, graphs, signatures, metadata.

This mirrors proto/model.fbs one to one. Files are parsed into it (lite/format.py), the
builder and the converter produce it, and the planner runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sporenet.lite.errors import SignatureError
from sporenet.lite.ops import OpCode

AttrValue = int | float | str | list[int] | list[float]

DYNAMIC = -1
"""A dimension whose size is known only when the graph is planned for concrete inputs."""


@dataclass(slots=True)
class Quantization:
    """Affine quantization: real = scale * (q - zero_point), per tensor or per axis."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None


@dataclass(slots=True)
class Sparsity:
    """Sparse encoding of a constant tensor (format from the schema's SparseFormat)."""

    format: int
    dense_shape: tuple[int, ...]
    block_shape: tuple[int, ...] = ()
    indptr: np.ndarray | None = None
    indices: np.ndarray | None = None


@dataclass(slots=True)
class Tensor:
    """One entry of the model's tensor table."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    data: np.ndarray | None = None
    quantization: Quantization | None = None
    sparsity: Sparsity | None = None
    trainable: bool = False
    # One name per dimension ("" for none), as ONNX's dim_param: dimensions that share a
    # name have the same size. Empty when no dimension is named.
    dim_names: tuple[str, ...] = ()

    @property
    def is_constant(self) -> bool:
        return self.data is not None


def shape_text(tensor: Tensor) -> str:
    """A tensor's shape with dynamic dimensions shown by name (ONNX dim_param) or as "?"."""
    names = tensor.dim_names or ("",) * len(tensor.shape)
    dims = [
        str(d) if d != DYNAMIC else (name or "?")
        for d, name in zip(tensor.shape, names, strict=True)
    ]
    return f"[{', '.join(dims)}]"


@dataclass(slots=True)
class Node:
    """One op application: inputs and outputs are tensor indices (-1: absent input)."""

    op: OpCode
    inputs: list[int]
    outputs: list[int]
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    version: int = 1
    name: str = ""


@dataclass
class Graph:
    """A subgraph: its inputs and outputs (tensor indices) and nodes in topological order."""

    name: str
    inputs: list[int]
    outputs: list[int]
    nodes: list[Node]


@dataclass
class Signature:
    """A named entry point into a graph, with user-facing input and output names."""

    key: str
    graph: int
    inputs: dict[str, int]
    outputs: dict[str, int]


@dataclass
class Model:
    """A whole model: the tensor table shared by all graphs, graphs, signatures, metadata."""

    tensors: list[Tensor]
    graphs: list[Graph]
    signatures: dict[str, Signature] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    producer: str = "sporenet"
    producer_version: str = ""
    description: str = ""

    def signature(self, key: str = "infer") -> Signature:
        """The signature named `key`. "infer" also names the model's default entry point:
        without a signature of that name, the first signature of graph 0 (a converted
        TFLite model's `serving_default`); a model without signatures exposes graph 0."""
        if key in self.signatures:
            return self.signatures[key]
        if key == "infer":
            main = next((s for s in self.signatures.values() if s.graph == 0), None)
            if main is not None:
                return main
        if not self.signatures and key == "infer" and self.graphs:
            graph = self.graphs[0]
            return Signature(
                key="infer",
                graph=0,
                inputs={self.tensors[i].name: i for i in graph.inputs},
                outputs={self.tensors[i].name: i for i in graph.outputs},
            )
        raise SignatureError(f"no signature {key!r}; the model has {sorted(self.signatures)}")

    def tensor_index(self, name: str) -> int:
        """Index of the tensor called `name` (linear scan; use for tools, not hot paths)."""
        for index, tensor in enumerate(self.tensors):
            if tensor.name == name:
                return index
        raise KeyError(f"no tensor named {name!r}")

    def weights(self) -> dict[str, np.ndarray]:
        """All constant tensors by name (views, not copies)."""
        return {t.name: t.data for t in self.tensors if t.data is not None}

    def parameter_count(self) -> int:
        """Number of elements in float constant tensors (the model's parameters)."""
        floats = (t.data for t in self.tensors if t.data is not None and t.data.dtype.kind == "f")
        return int(sum(d.size for d in floats))
