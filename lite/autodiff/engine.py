"""The autodiff engine: walk a graph backwards from a scalar loss, asking each op's gradient
rule (lite/autodiff/rules/) to emit the nodes that compute its input gradients.

A rule sees the forward node and the gradients of its outputs (tensor indices, None for an
output the loss does not depend on) and returns one gradient per node input (None where
there is none). It emits nodes through a GradContext (lite/autodiff/context.py), a small
builder over the graph being differentiated; shapes of forward tensors are known (dynamic
dimensions as -1), so rules stay valid for any batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.autodiff.rules import GRADIENT_RULES
from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.errors import ShapeError, UnsupportedOpError
from sporenet.lite.graph import Model, Node
from sporenet.lite.ops import OpCode


def _is_float(model: Model, index: int) -> bool:
    return model.tensors[index].dtype.kind == "f"


def _check_indices(model: Model, loss: int, wrt: Sequence[int]) -> None:
    """The loss is a tensor of the model and every `wrt` tensor a float one."""
    if not 0 <= loss < len(model.tensors):
        raise ShapeError(f"loss tensor index {loss} out of range")
    for t in wrt:
        if not 0 <= t < len(model.tensors) or not _is_float(model, t):
            raise ShapeError(
                f"cannot differentiate with respect to tensor {t}: not a float tensor of the model"
            )


def _on_path(
    model: Model,
    forward: list[Node],
    loss: int,
    wrt: Sequence[int],
) -> tuple[set[int], list[Node]]:
    """The float tensors that need a gradient (they depend on some `wrt` tensor and the
    loss depends on them) and the nodes between them, in forward order."""
    depends = set(wrt)
    for node in forward:
        if any(i in depends for i in node.inputs):
            depends.update(o for o in node.outputs if _is_float(model, o))
    relevant = {loss}
    for node in reversed(forward):
        if any(o in relevant for o in node.outputs):
            relevant.update(i for i in node.inputs if i != -1)
    needed = {t for t in depends & relevant if _is_float(model, t)}
    on_path = [
        n
        for n in forward
        if any(o in needed for o in n.outputs) and any(i in needed for i in n.inputs)
    ]
    return needed, on_path


def append_gradients(
    model: Model, graph_index: int, loss: int, wrt: Sequence[int], *, infer_shapes: bool = True
) -> dict[int, int]:
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
    _check_indices(model, loss, wrt)
    if infer_shapes:
        fill_inferred_shapes(model, graph_index)
    loss_tensor = model.tensors[loss]
    if (
        not _is_float(model, loss)
        or int(np.prod(loss_tensor.shape)) != 1
        or (-1 in loss_tensor.shape)
    ):
        raise ShapeError(
            f"the loss {loss_tensor.name!r} must be a float scalar, got "
            f"{loss_tensor.dtype}{list(loss_tensor.shape)}"
        )
    ctx = GradContext(model, graph_index, ())
    ctx.scope = f"grad/{loss_tensor.name}"
    seed = ctx.constant("seed", np.ones(loss_tensor.shape), loss_tensor.dtype)
    result = _backward(model, graph_index, {loss: seed}, wrt)
    if infer_shapes:
        fill_inferred_shapes(model, graph_index)
    return result


def append_vjp(
    model: Model,
    graph_index: int,
    cotangents: dict[int, int],
    wrt: Sequence[int],
    *,
    infer_shapes: bool = True,
) -> dict[int, int]:
    """Append nodes computing the vector-Jacobian product to a graph, in place: for each
    t in `wrt`, sum over outputs y of cotangents[y] . dy/dt, where each cotangent is a
    tensor of its output's shape. append_gradients is the case of one scalar output with
    a cotangent of one. Returns {t: index of its gradient tensor}, as append_gradients.
    """
    for y in cotangents:
        _check_indices(model, y, wrt)
        if not _is_float(model, y):
            raise ShapeError(f"cannot differentiate the non-float output {model.tensors[y].name!r}")
    if infer_shapes:
        fill_inferred_shapes(model, graph_index)
    result = _backward(model, graph_index, cotangents, wrt)
    if infer_shapes:
        fill_inferred_shapes(model, graph_index)
    return result


def _backward(
    model: Model, graph_index: int, cotangents: dict[int, int], wrt: Sequence[int]
) -> dict[int, int]:
    """The nodes of the vector-Jacobian product (append_vjp without shape inference)."""
    graph = model.graphs[graph_index]
    wrt = list(dict.fromkeys(wrt))
    needed: set[int] = set()
    picked: set[int] = set()  # positions of the nodes on some output's path
    forward = list(graph.nodes)
    position = {id(n): k for k, n in enumerate(forward)}
    for y in cotangents:
        more, nodes = _on_path(model, forward, y, wrt)
        needed |= more
        picked.update(position[id(n)] for n in nodes)
    on_path = [forward[k] for k in sorted(picked)]
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
            parts = [
                ctx.op(OpCode.ADD, parts[k : k + 2]) if k + 1 < len(parts) else parts[k]
                for k in range(0, len(parts), 2)
            ]
        pending[t] = parts
        return parts[0]

    for y, seed in cotangents.items():
        pending.setdefault(y, []).append(seed)
    for node in reversed(on_path):
        out_grads = [total(o) for o in node.outputs]
        if all(g is None for g in out_grads):
            continue
        ctx.scope = f"grad/{node.name}"
        in_grads = GRADIENT_RULES[node.op](ctx, node, out_grads)
        if len(in_grads) != len(node.inputs):
            raise ShapeError(
                f"gradient rule of {node.op.name} returned {len(in_grads)} "
                f"gradients for {len(node.inputs)} inputs"
            )
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
    return result
