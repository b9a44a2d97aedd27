"""What a gradient rule works with: GradContext, a small builder over the graph being
differentiated, and the GradRule signature. Kept apart from the engine so that the rules
(lite/autodiff/rules/) and the engine that calls them import this module, not each other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from sporenet.lite.builder import unique_name
from sporenet.lite.graph import Graph, Model, Node, Tensor
from sporenet.lite.ops import OpCode


class GradContext:
    """What a gradient rule may do: read forward shapes, emit nodes, add constants."""

    def __init__(self, model: Model, graph_index: int, needed: Collection[int]) -> None:
        self.model = model
        self.graph = model.graphs[graph_index]
        self._needed = needed
        self._names = {t.name for t in model.tensors}
        self.scope = "grad"

    # ---- reading the forward graph
    def shape(self, index: int) -> tuple[int, ...]:
        """Static shape of a forward tensor (-1 marks a dimension that follows the batch)."""
        return tuple(self.model.tensors[index].shape)

    def dtype(self, index: int) -> np.dtype:
        return self.model.tensors[index].dtype

    def rank(self, index: int) -> int:
        return len(self.model.tensors[index].shape)

    def value(self, index: int) -> np.ndarray | None:
        """The data of a constant tensor (shape arguments, axes), else None."""
        return self.model.tensors[index].data

    def needs(self, index: int) -> bool:
        """Whether the loss gradient must flow into this tensor (skip work otherwise)."""
        return index != -1 and index in self._needed

    # ---- emitting nodes
    def _unique(self, name: str) -> str:
        return unique_name(name, self._names)

    def _tensor(
        self, name: str, dtype: Any, shape: Sequence[int] = (), *, data: np.ndarray | None = None
    ) -> int:
        self.model.tensors.append(
            Tensor(name=self._unique(name), dtype=np.dtype(dtype), shape=tuple(shape), data=data)
        )
        return len(self.model.tensors) - 1

    def tensor(self, name: str, dtype: Any, shape: Sequence[int] = ()) -> int:
        """A fresh tensor (a subgraph input a rule builds), named under the rule's scope."""
        return self._tensor(f"{self.scope}/{name}", dtype, shape)

    def child(self, graph_index: int) -> GradContext:
        """A context emitting into another graph of the model (a subgraph a rule builds),
        sharing this one's tensor names."""
        ctx = GradContext.__new__(GradContext)
        ctx.model, ctx.graph, ctx._needed = self.model, self.model.graphs[graph_index], ()
        ctx._names, ctx.scope = self._names, self.scope
        return ctx

    def adopt_names(self) -> None:
        """Reserve the names of tensors appended by another context (a nested engine run)."""
        self._names.update(t.name for t in self.model.tensors)

    def add_graph(self, graph: Graph) -> int:
        """Append a subgraph (control-flow gradients) and return its graph index."""
        self.model.graphs.append(graph)
        return len(self.model.graphs) - 1

    def op_multi(
        self, op: OpCode, inputs: Sequence[int], num_outputs: int, **attrs: Any
    ) -> list[int]:
        """Append a node; its outputs are fresh tensors (shapes inferred afterwards)."""
        base = self._unique(f"{self.scope}/{op.name.lower()}")
        outputs = [
            self._tensor(f"{base}:{k}" if num_outputs > 1 else base, np.float32)
            for k in range(num_outputs)
        ]
        self.graph.nodes.append(
            Node(op=op, inputs=list(inputs), outputs=outputs, attrs=dict(attrs), name=base)
        )
        return outputs

    def op(self, op: OpCode, inputs: Sequence[int], **attrs: Any) -> int:
        return self.op_multi(op, inputs, 1, **attrs)[0]

    def constant(self, name: str, value: Any, dtype: Any) -> int:
        array = np.array(value, dtype=dtype)  # a copy; keeps 0-d scalars 0-d
        return self._tensor(f"{self.scope}/{name}", array.dtype, array.shape, data=array)

    def scalar(self, value: float, like: int) -> int:
        """A scalar constant with the dtype of tensor `like`."""
        return self.constant("scalar", value, self.dtype(like))

    # ---- common patterns
    def sum_to(self, grad: int, like: int, out: int) -> int:
        """`grad` (shaped like forward tensor `out`) summed over broadcast axes to the shape
        of `like`; no node when the two shapes agree."""
        if self.shape(like) == self.shape(out):
            return grad
        return self.op(OpCode.REDUCE_SUM_TO, [grad, like])

    def scale(self, grad: int, factor: float, like: int) -> int:
        """grad * factor, the constant having the dtype of tensor `like`."""
        return self.op(OpCode.MUL, [grad, self.scalar(factor, like)])


GradRule = Callable[[GradContext, Node, list[int | None]], Sequence[int | None]]
"""rule(ctx, node, output_grads) -> one gradient tensor index (or None) per node input."""
