"""TFLite IF and WHILE: their subgraphs become IR subgraphs of the same file (IF and LOOP).

TFLite subgraphs take all their values as explicit inputs, so a branch or body maps onto
an IR subgraph one input for one input, in TFLite's axis order. An IF whose condition is
known at conversion is inlined (only the taken branch is imported, into the enclosing
graph). A WHILE becomes a LOOP without trip count whose first condition is the cond
subgraph imported on the initial values, and whose body is TFLite's body followed by the
cond subgraph on the new values.

Resource variables the branches or the body (or subgraphs they run) read or assign are
threaded through them (variables.py): the current values enter as extra IF inputs or
loop-carried values, and the values the subgraph leaves are assigned back after it.
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.tflite_import.layout import LayoutContext, Perm, compose, identity
from sporenet.converter.tflite_import.ops.common import Shared
from sporenet.converter.tflite_import.ops.variables import (
    current_value,
    subgraph_variables,
    write_back,
)
from sporenet.converter.tflite_import.reader import TfliteOperator
from sporenet.lite.graph import Graph
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.ops import OpCode

MAX_NESTING = 16
"""Subgraphs nested deeper than this are refused (a hostile file may make them recurse)."""

Held = tuple[int, Perm]


HANDLE: Held = (-1, ())  # how a resource handle is held: no IR value


def run_subgraph(
    lc: LayoutContext,
    index: int,
    args: list[Held],
    ctx: ImportContext | None = None,
    keys: dict[int, str] | None = None,
) -> list[Held]:
    """Import subgraph `index` into `ctx` (the enclosing graph's, inline, by default) with
    its inputs bound to `args`; `keys` names the variables of the inputs that are
    resource handles (by position). Returns its outputs as (IR tensor, axis order)."""
    from sporenet.converter.tflite_import.importer import import_operators  # imports this

    shared = lc.shared
    if not isinstance(shared, Shared):
        raise lc.fail("subgraphs need the model's shared import state")
    if shared.depth >= MAX_NESTING:
        raise lc.fail(f"subgraphs are nested more than {MAX_NESTING} deep")
    graph = lc.model.subgraphs[index]
    if len(graph.inputs) != len(args):
        raise lc.fail(
            f"subgraph {index} ({graph.name!r}) takes {len(graph.inputs)} inputs, "
            f"the operator gives {len(args)}"
        )
    inner = lc.sub(graph, ctx if ctx is not None else lc.ctx.subcontext(inline=True))
    for i, held in zip(graph.inputs, args, strict=True):
        if len(held[1]) != len(graph.tensors[i].shape):
            raise lc.fail(
                f"subgraph {index} input {graph.tensors[i].name!r} has rank "
                f"{len(graph.tensors[i].shape)}, the operator gives rank {len(held[1])}"
            )
        inner.held[i] = held
    for position, key in (keys or {}).items():
        shared.handles[(index, graph.inputs[position])] = key
    shared.depth += 1
    try:
        import_operators(inner)
    finally:
        shared.depth -= 1
    lc.ctx.where = lc.where
    missing = [graph.tensors[o].name for o in graph.outputs if o not in inner.held]
    if missing:
        raise lc.fail(f"subgraph {index} outputs {missing} are not computed")
    return [inner.held[o] for o in graph.outputs]


def _graph(
    lc: LayoutContext,
    index: int,
    args: list[int | str],
    state: dict[str, int],
    *,
    body: bool = False,
    then_cond: int | None = None,
) -> tuple[ImportContext, list[int], list[int], list[int], int | None]:
    """Subgraph `index` as an IR subgraph taking inputs like `args` (IR tensors in TFLite's
    order, or the keys of variables whose handles it takes) and then like the threaded
    variables' values `state`; with `body`, a LOOP body (iteration and condition inputs
    first). `then_cond`: a cond subgraph run after it on its outputs, giving the next
    condition. Returns the context, the IR inputs, the outputs that are values (handles
    passed through are dropped), the threaded variables' last values (in `state`'s
    order) and the next condition."""
    sub = lc.ctx.subcontext()
    explicit = []
    if body:
        explicit = [
            sub.graph_input("iteration", (), np.dtype(np.int64)),
            sub.graph_input("condition", (), np.dtype(np.bool_)),
        ]
    inputs = []
    values = [a for a in args if isinstance(a, int)]
    for v in [*values, *state.values()]:
        new = sub.input_like(v)
        lc.set_quantization(new, lc.ctx.tensors[v].quantization)
        inputs.append(new)
    fed = iter(inputs)
    bound: list[Held] = []
    for arg in args:
        if isinstance(arg, str):
            bound.append(HANDLE)
        else:
            i = next(fed)
            bound.append((i, identity(sub.rank(i))))
    keys = {k: a for k, a in enumerate(args) if isinstance(a, str)}
    shared = lc.shared
    if not isinstance(shared, Shared):
        raise lc.fail("subgraphs need the model's shared import state")
    thread = dict(zip(state, inputs[len(values) :], strict=True))
    shared.detached += 1
    shared.threads.append(thread)
    try:
        outs = run_subgraph(lc, index, bound, sub, keys)
        inner = lc.sub(lc.model.subgraphs[index], sub)
        results = [_in_order(inner, held) if held != HANDLE else -1 for held in outs]
        next_cond = None
        if then_cond is not None:
            cond_lc = lc.sub(lc.model.subgraphs[then_cond], sub)
            held = [(v, identity(sub.rank(v))) if v != -1 else HANDLE for v in results]
            (again,) = run_subgraph(cond_lc, then_cond, held, sub, keys)
            next_cond = _in_order(cond_lc, again)
        results = [r for r in results if r != -1]
    finally:
        shared.detached -= 1
        shared.threads.pop()
    return sub, [*explicit, *inputs], results, [thread[k] for k in state], next_cond


def _state(
    lc: LayoutContext, indices: list[int], passed: dict[int, str] | None = None
) -> dict[str, int]:
    """The variables the subgraphs `indices` use (`passed`: the keys of the handles they
    take, by input position), with their current values here."""
    return {
        key: current_value(lc, key, like)
        for key, like in subgraph_variables(lc, indices, passed or {}).items()
    }


def _operands(lc: LayoutContext, tensors: list[int]) -> tuple[list[int | str], dict[int, str]]:
    """An operator's subgraph operands: IR tensors, or the variable keys of handles."""
    shared = lc.shared
    handles = shared.handles if isinstance(shared, Shared) else {}
    keys = {
        k: handles[(lc.graph.index, t)]
        for k, t in enumerate(tensors)
        if lc.held.get(t) == HANDLE and (lc.graph.index, t) in handles
    }
    return [keys[k] if k in keys else lc.get(t) for k, t in enumerate(tensors)], keys


def _in_order(lc: LayoutContext, held: Held) -> int:
    """An IR tensor held in `held[1]` order as TFLite's own order."""
    ir, order = held
    if order == identity(len(order)):
        return ir
    return lc.ctx.emit1(OpCode.TRANSPOSE, [ir], perm=compose(order, identity(len(order))))


def if_(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    then_index, else_index = int(o.ThenSubgraphIndex()), int(o.ElseSubgraphIndex())
    cond = lc.get(op.inputs[0])
    args = op.inputs[1:]
    known = lc.ctx.value(cond)
    if known is not None:
        if known.size != 1:
            raise lc.fail(f"the condition must hold one element, got shape {list(known.shape)}")
        taken = then_index if bool(known.reshape(-1)[0]) else else_index
        branch = run_subgraph(lc, taken, [lc.held[a] for a in args])
        for out, held in zip(op.outputs, branch, strict=True):
            lc.held[out] = held
        return
    operands, passed = _operands(lc, args)
    values = [a for a in operands if isinstance(a, int)]
    state = _state(lc, [then_index, else_index], passed)
    graphs = []
    for index in (then_index, else_index):
        sub, inputs, outs, last, _ = _graph(lc, index, operands, state)
        graphs.append((sub, inputs, [*outs, *last], index))
    (then_ctx, _, then_outs, _), (else_ctx, _, else_outs, _) = graphs
    if len(then_outs) != len(op.outputs) + len(state) or len(else_outs) != len(then_outs):
        raise lc.fail(
            f"the branches give {len(then_outs) - len(state)} and {len(else_outs) - len(state)} "
            f"outputs for {len(op.outputs)}"
        )
    specs = []
    for k, (a, b) in enumerate(zip(then_outs, else_outs, strict=True)):
        sa, sb = [v[a] for v in then_ctx.views], [v[b] for v in else_ctx.views]
        if any((x.shape, x.dtype) != (y.shape, y.dtype) for x, y in zip(sa, sb, strict=True)):
            raise lc.fail(
                f"output {k} is {sa[0].dtype}{list(sa[0].shape)} in the then branch and "
                f"{sb[0].dtype}{list(sb[0].shape)} in the else branch; a planned model needs one"
            )
        specs.append([TensorSpec(s.shape, s.dtype) for s in sa])
    attrs: dict[str, int] = {}
    for (sub, inputs, outs, index), key in zip(graphs, ("then_graph", "else_graph"), strict=True):
        name = lc.model.subgraphs[index].name
        attrs[key] = lc.ctx.add_subgraph(
            Graph(name=name, inputs=inputs, outputs=outs, nodes=sub.nodes)
        )
    results = lc.ctx.emit_control(OpCode.IF, [cond, *values, *state.values()], specs, **attrs)
    _declare(lc, op.outputs, results, [then_ctx.tensors[o] for o in then_outs])
    _write_back(lc, state, results[len(op.outputs) :])


def _write_back(lc: LayoutContext, state: dict[str, int], results: list[int]) -> None:
    """The threaded variables take the values a subgraph's extra outputs hold."""
    for (key, before), ir in zip(state.items(), results, strict=True):
        lc.set_quantization(ir, lc.ctx.tensors[before].quantization)
        write_back(lc, key, ir)


def _declare(lc: LayoutContext, outputs: list[int], results: list[int], like: list) -> None:
    for out, ir, tensor in zip(outputs, results, like, strict=False):
        lc.ctx.tensors[ir].shape = tensor.shape
        lc.set_quantization(ir, tensor.quantization)
        lc.set(out, ir)


def while_(lc: LayoutContext, op: TfliteOperator) -> None:
    o = op.options
    cond_index, body_index = int(o.CondSubgraphIndex()), int(o.BodySubgraphIndex())
    if len(op.outputs) != len(op.inputs):
        raise lc.fail(f"{len(op.inputs)} loop values in, {len(op.outputs)} out")
    operands, passed = _operands(lc, list(op.inputs))
    values = [a for a in operands if isinstance(a, int)]
    held = [HANDLE if isinstance(v, str) else (v, identity(lc.ctx.rank(v))) for v in operands]
    (first,) = run_subgraph(lc, cond_index, held, keys=passed)
    start = _in_order(lc, first)
    known = lc.ctx.value(start)
    value_outputs = [o for k, o in enumerate(op.outputs) if k not in passed]
    for k, key in passed.items():  # a handle looped through stays the same variable
        _pass_handle(lc, op.outputs[k], key)
    if known is not None and not bool(known.reshape(-1)[0]):  # never enters the loop
        for out, v in zip(value_outputs, values, strict=True):
            lc.set(out, v)
        return
    state = _state(lc, [body_index, cond_index], passed)
    sub, inputs, outs, last, next_cond = _graph(
        lc, body_index, operands, state, body=True, then_cond=cond_index
    )
    if next_cond is None:
        raise lc.fail("the body's next condition was not computed")
    carried = [*values, *state.values()]
    outs = [*outs, *last]
    specs = []
    for k, (before, after) in enumerate(zip(carried, outs, strict=True)):
        sa, sb = [v[before] for v in lc.ctx.views], [v[after] for v in sub.views]
        if any((x.shape, x.dtype) != (y.shape, y.dtype) for x, y in zip(sa, sb, strict=True)):
            raise lc.fail(
                f"loop value {k} enters as {sa[0].dtype}{list(sa[0].shape)} and leaves the "
                f"body as {sb[0].dtype}{list(sb[0].shape)}; a planned loop needs one shape"
            )
        specs.append([TensorSpec(s.shape, s.dtype) for s in sa])
    body = lc.ctx.add_subgraph(
        Graph(
            name=lc.model.subgraphs[body_index].name,
            inputs=inputs,
            outputs=[next_cond, *outs],
            nodes=sub.nodes,
        )
    )
    results = lc.ctx.emit_control(
        OpCode.LOOP, [-1, start, *carried], specs, body=body, num_carried=len(carried)
    )
    _declare(lc, value_outputs, results, [lc.ctx.tensors[v] for v in values])
    _write_back(lc, state, results[len(values) :])


def _pass_handle(lc: LayoutContext, tensor: int, key: str) -> None:
    """TFLite tensor `tensor` is a handle of variable `key` (a WHILE's looped handle)."""
    shared = lc.shared
    if isinstance(shared, Shared):
        shared.handles[(lc.graph.index, tensor)] = key
    lc.held[tensor] = HANDLE
