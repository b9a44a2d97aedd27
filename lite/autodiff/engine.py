"""The autodiff engine: walk a graph backwards from a scalar loss, asking each op's gradient
rule (lite/autodiff/rules/) to emit the nodes that compute its input gradients.

A rule sees the forward node and the gradients of its outputs (tensor indices, None for an
output the loss does not depend on) and returns one gradient per node input (None where
there is none). It emits nodes through a GradContext, a small builder over the graph being
differentiated; shapes of forward tensors are known (dynamic dimensions as -1), so rules
stay valid for any batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from sporenet.lite.builder import fill_inferred_shapes, unique_name
from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.graph import Model, Node, Tensor
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

    def _tensor(self, name: str, dtype: Any, shape: Sequence[int] = (), *,
                data: np.ndarray | None = None) -> int:
        self.model.tensors.append(Tensor(name=self._unique(name), dtype=np.dtype(dtype),
                                         shape=tuple(shape), data=data))
        return len(self.model.tensors) - 1

    def op_multi(self, op: OpCode, inputs: Sequence[int], num_outputs: int,
                 **attrs: Any) -> list[int]:
        """Append a node; its outputs are fresh tensors (shapes inferred afterwards)."""
        base = self._unique(f"{self.scope}/{op.name.lower()}")
        outputs = [self._tensor(f"{base}:{k}" if num_outputs > 1 else base, np.float32)
                   for k in range(num_outputs)]
        self.graph.nodes.append(Node(op=op, inputs=list(inputs), outputs=outputs,
                                     attrs=dict(attrs), name=base))
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


def _is_float(model: Model, index: int) -> bool:
    return model.tensors[index].dtype.kind == "f"


def append_gradients(model: Model, graph_index: int, loss: int, wrt: Sequence[int], *,
                     infer_shapes: bool = True) -> dict[int, int]:
    """Append nodes computing d(loss)/d(t) for each t in `wrt` to a graph, in place.

    `loss` is the index of a scalar float tensor the graph computes. Returns {t: index of
    its gradient tensor}; a tensor the loss does not depend on gets a zero gradient.
    Only nodes between `wrt` and the loss are differentiated, and only the gradients some
    `wrt` tensor needs are computed. The graph's tensors get their inferred shapes (as
    ModelBuilder.build stores them), so the new nodes plan for any batch size. With
    infer_shapes=False the caller vouches that the forward tensors already carry their
    shapes (an eager tape records concrete ones): shape inference, which prepares every
    kernel twice, is skipped, and the appended tensors keep placeholder shapes. Raises
    UnsupportedOpError naming every op on the path that has no gradient rule.
    """
    from sporenet.lite.autodiff.rules import GRADIENT_RULES

    graph = model.graphs[graph_index]
    if not 0 <= loss < len(model.tensors):
        raise ShapeError(f"loss tensor index {loss} out of range")
    wrt = list(dict.fromkeys(wrt))
    for t in wrt:
        if not 0 <= t < len(model.tensors) or not _is_float(model, t):
            raise ShapeError(f"cannot differentiate with respect to tensor {t}: not a float "
                             "tensor of the model")
    if infer_shapes:
        fill_inferred_shapes(model, graph_index)
    loss_tensor = model.tensors[loss]
    if not _is_float(model, loss) or int(np.prod(loss_tensor.shape)) != 1 or (
            -1 in loss_tensor.shape):
        raise ShapeError(f"the loss {loss_tensor.name!r} must be a float scalar, got "
                         f"{loss_tensor.dtype}{list(loss_tensor.shape)}")

    forward = list(graph.nodes)
    # Tensors that depend on some `wrt` tensor and that the loss depends on need gradients.
    depends = set(wrt)
    for node in forward:
        if any(i in depends for i in node.inputs):
            depends.update(o for o in node.outputs if _is_float(model, o))
    relevant = {loss}
    for node in reversed(forward):
        if any(o in relevant for o in node.outputs):
            relevant.update(i for i in node.inputs if i != -1)
    needed = {t for t in depends & relevant if _is_float(model, t)}
    on_path = [n for n in forward if any(o in needed for o in n.outputs)
               and any(i in needed for i in n.inputs)]
    missing = sorted({n.op.name for n in on_path if n.op not in GRADIENT_RULES})
    if missing:
        raise UnsupportedOpError(
            f"no gradient rule for {', '.join(missing)}; ops with rules: "
            f"{', '.join(sorted(op.name for op in GRADIENT_RULES))}"
        )

    ctx = GradContext(model, graph_index, needed)
    pending: dict[int, list[int]] = {}

    def total(t: int) -> int | None:
        parts = pending.get(t)
        if not parts:
            return None
        while len(parts) > 1:  # sum pairwise so the graph stays shallow
            parts = [ctx.op(OpCode.ADD, parts[k:k + 2]) if k + 1 < len(parts) else parts[k]
                     for k in range(0, len(parts), 2)]
        pending[t] = parts
        return parts[0]

    ctx.scope = f"grad/{loss_tensor.name}"
    seed = ctx.constant("seed", np.ones(loss_tensor.shape), loss_tensor.dtype)
    pending[loss] = [seed]
    for node in reversed(on_path):
        out_grads = [total(o) for o in node.outputs]
        if all(g is None for g in out_grads):
            continue
        ctx.scope = f"grad/{node.name}"
        in_grads = GRADIENT_RULES[node.op](ctx, node, out_grads)
        if len(in_grads) != len(node.inputs):
            raise ShapeError(f"gradient rule of {node.op.name} returned {len(in_grads)} "
                             f"gradients for {len(node.inputs)} inputs")
        for i, g in zip(node.inputs, in_grads, strict=True):
            if g is not None and i in needed:
                pending.setdefault(i, []).append(g)

    result: dict[int, int] = {}
    for t in wrt:
        g = total(t)
        if g is None:
            ctx.scope = f"grad/{model.tensors[t].name}"
            g = ctx.op(OpCode.MUL, [t, ctx.scalar(0.0, t)])
        result[t] = g
    if infer_shapes:
        fill_inferred_shapes(model, graph_index)
    return result
