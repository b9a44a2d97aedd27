"""Gradients of the ops that run subgraphs (kernels: lite/kernels/control_flow.py).

Each backward is again a subgraph op, so a loop is differentiated without unrolling:
- CALL: a CALL of its `grad_graph` (a user's custom backward, MindSpore's bprop) on
  (inputs, outputs, output gradients), or of the automatic vjp of its graph;
- IF: an IF on the same condition whose branches are the vjps of the two branches;
- LOOP with a trip count known when the model is built: one LOOP that recomputes the
  carried values of every iteration as scan outputs, then one LOOP running the body's vjp
  backwards over them (iteration T-1-j at step j), carrying the carried values' gradients
  and summing the implicit inputs' ones; a scan output's gradient enters at its
  iteration's row. The training graph holds the body three times
  (forward, recompute, backward), whatever the trip count.
The subgraphs built here are differentiated again by the same rules, so a second
derivative works wherever the ops inside have second-order rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sporenet.lite.autodiff.context import GradContext
from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.dims import batch_names
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.graph import Graph, Node
from sporenet.lite.ops import OpCode


def _is_float(ctx: GradContext, index: int) -> bool:
    return ctx.dtype(index).kind == "f"


def _filled(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int]:
    """Output gradients with zeros where the loss does not use an output."""
    return [
        g if g is not None else ctx.op(OpCode.MUL, [o, ctx.scalar(0.0, o)])
        for g, o in zip(grads, node.outputs, strict=True)
    ]


def _typed(ctx: GradContext, outs: list[int], likes: Sequence[int]) -> list[int]:
    """Give a subgraph node's outputs the dtypes of `likes` (validation runs before the
    engine infers shapes)."""
    for out, like in zip(outs, likes, strict=True):
        ctx.model.tensors[out].dtype = ctx.dtype(like)
    return outs


def _like(ctx: GradContext, index: int, name: str, lead: tuple[int, ...] = ()) -> int:
    """A fresh subgraph input of the dtype and shape of tensor `index` (after `lead`)."""
    t = ctx.model.tensors[index]
    new = ctx.tensor(name, t.dtype, (*lead, *t.shape))
    names = t.dim_names and ("",) * len(lead) + tuple(t.dim_names)
    ctx.model.tensors[new].dim_names = batch_names((*lead, *t.shape), names)
    return new


def _clone(sub: GradContext, graph: Graph, mapping: dict[int, int]) -> None:
    """Append copies of `graph`'s nodes to `sub`'s graph; `mapping` maps the source's
    tensors to the copies (given for its inputs, filled for its node outputs). Tensors
    outside the mapping are constants, read directly."""
    for node in graph.nodes:
        outs = [
            sub.tensor(sub.model.tensors[o].name.rsplit("/", 1)[-1], np.float32)
            for o in node.outputs
        ]
        for o, new in zip(node.outputs, outs, strict=True):
            src = sub.model.tensors[o]
            sub.model.tensors[new].dtype = src.dtype
            sub.model.tensors[new].shape = tuple(src.shape)
            sub.model.tensors[new].dim_names = tuple(src.dim_names)
            mapping[o] = new
        inputs = [-1 if i == -1 else mapping.get(i, i) for i in node.inputs]
        sub.graph.nodes.append(
            Node(
                op=node.op,
                inputs=inputs,
                outputs=outs,
                attrs=dict(node.attrs),
                version=node.version,
                name=f"{sub.scope}/{node.name}",
            )
        )


def vjp_graph(ctx: GradContext, graph_index: int, select: Sequence[int], name: str) -> int:
    """A new subgraph computing the vjp of graph `graph_index`: inputs (its inputs..., one
    gradient per output...), outputs the gradients of its inputs at positions `select`."""
    from sporenet.lite.autodiff.engine import append_vjp  # the engine imports the rules

    src = ctx.model.graphs[graph_index]
    fill_inferred_shapes(ctx.model, graph_index)  # its tensors' dtypes and shapes, copied
    ctx.scope = f"{ctx.scope}/{name}"
    xs = [_like(ctx, i, "x") for i in src.inputs]
    graph = Graph(name=ctx.scope, inputs=list(xs), outputs=[], nodes=[])
    gi = ctx.add_graph(graph)
    sub = ctx.child(gi)
    mapping = dict(zip(src.inputs, xs, strict=True))
    _clone(sub, src, mapping)
    seeds: dict[int, int] = {}
    for y in src.outputs:
        dy = _like(ctx, y, "dy")
        graph.inputs.append(dy)
        y = mapping.get(y, y)
        if not _is_float(ctx, y):
            continue
        if y in seeds:  # one tensor given out twice: its gradients add up
            dy = sub.op(OpCode.ADD, [seeds[y], dy])
        seeds[y] = dy
    grads = append_vjp(ctx.model, gi, seeds, [xs[k] for k in select])
    ctx.adopt_names()
    graph.outputs = [grads[xs[k]] for k in select]
    return gi


def call(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    dys = _filled(ctx, node, grads)
    custom = int(node.attrs.get("grad_graph", -1))
    if custom != -1:  # the user's backward: (inputs, outputs, dys) -> one per input
        outs = ctx.op_multi(
            OpCode.CALL, [*node.inputs, *node.outputs, *dys], len(node.inputs), graph=custom
        )
        _typed(ctx, outs, node.inputs)
        return [
            g if _is_float(ctx, i) and ctx.needs(i) else None
            for g, i in zip(outs, node.inputs, strict=True)
        ]
    select = [k for k, i in enumerate(node.inputs) if _is_float(ctx, i) and ctx.needs(i)]
    scope = ctx.scope
    gi = vjp_graph(ctx, int(node.attrs["graph"]), select, "vjp")
    ctx.scope = scope
    outs = ctx.op_multi(OpCode.CALL, [*node.inputs, *dys], len(select), graph=gi)
    _typed(ctx, outs, [node.inputs[k] for k in select])
    result: list[int | None] = [None] * len(node.inputs)
    for k, g in zip(select, outs, strict=True):
        result[k] = g
    return result


def if_(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    implicit = node.inputs[1:]
    dys = _filled(ctx, node, grads)
    select = [k for k, i in enumerate(implicit) if _is_float(ctx, i) and ctx.needs(i)]
    if not select:
        return [None] * len(node.inputs)
    scope = ctx.scope
    branches = {}
    for attr in ("then_graph", "else_graph"):
        gi = int(node.attrs[attr])
        branches[attr] = -1 if gi == -1 else vjp_graph(ctx, gi, select, attr[:4])
        ctx.scope = scope
    reasons = {
        f"{a[:4]}_error": node.attrs[f"{a[:4]}_error"]
        for a in branches
        if f"{a[:4]}_error" in node.attrs
    }
    outs = ctx.op_multi(
        OpCode.IF, [node.inputs[0], *implicit, *dys], len(select), **branches, **reasons
    )
    _typed(ctx, outs, [implicit[k] for k in select])
    result: list[int | None] = [None] * len(node.inputs)
    for k, g in zip(select, outs, strict=True):
        result[1 + k] = g
    return result


def _trip_count(ctx: GradContext, node: Node) -> int:
    """The loop's constant trip count, refusing loops whose iterations values decide."""
    what = f"LOOP {node.name!r}"
    trip, cond = node.inputs[0], node.inputs[1]
    value = None if trip == -1 else ctx.value(trip)
    if value is None:
        raise UnsupportedOpError(
            f"{what}: no gradient without a trip count known when the model is built "
            "(cloud.fori_loop gives one; a while_loop's iterations are known only at run time)"
        )
    if cond != -1 and (ctx.value(cond) is None or not bool(np.all(ctx.value(cond)))):
        raise UnsupportedOpError(f"{what}: no gradient with a condition computed at run time")
    body = ctx.model.graphs[int(node.attrs["body"])]
    keep = body.outputs[0]
    passes = keep == body.inputs[1] or any(
        n.op == OpCode.IDENTITY and n.outputs[0] == keep and n.inputs[0] == body.inputs[1]
        for n in body.nodes
    )
    constant = ctx.value(keep)
    if not passes and not (constant is not None and bool(np.all(constant))):
        raise UnsupportedOpError(
            f"{what}: no gradient when the body computes whether to continue (the trip "
            "count is then known only at run time)"
        )
    n = int(node.attrs["num_carried"])
    for i in node.inputs[2 : 2 + n]:
        if not _is_float(ctx, i):
            raise UnsupportedOpError(
                f"{what}: no gradient with a non-float carried value "
                f"({ctx.model.tensors[i].name!r})"
            )
    return max(int(np.ravel(value)[0]), 0)


def loop(ctx: GradContext, node: Node, grads: list[int | None]) -> list[int | None]:
    trips = _trip_count(ctx, node)
    n = int(node.attrs["num_carried"])
    state, implicit = node.inputs[2 : 2 + n], node.inputs[2 + n :]
    body_index = int(node.attrs["body"])
    body = ctx.model.graphs[body_index]
    fill_inferred_shapes(ctx.model, body_index)  # its tensors' dtypes and shapes, copied
    select = [k for k, i in enumerate(implicit) if _is_float(ctx, i) and ctx.needs(i)]
    dvs = _filled(ctx, node, grads)
    scope = ctx.scope
    stacks = _states_loop(ctx, node, body, n)
    gi = _backward_body(ctx, node, body, trips, n, select)

    # 3. The backward loop over the stacked states.
    ctx.scope = scope
    zeros = [ctx.op(OpCode.MUL, [implicit[k], ctx.scalar(0.0, implicit[k])]) for k in select]
    outs = ctx.op_multi(
        OpCode.LOOP,
        [node.inputs[0], -1, *dvs[:n], *zeros, *stacks, *dvs[n:], *implicit],
        n + len(select),
        body=gi,
        num_carried=n + len(select),
    )
    _typed(ctx, outs, [*state, *(implicit[k] for k in select)])
    result: list[int | None] = [None, None, *outs[:n], *([None] * len(implicit))]
    for k, g in zip(select, outs[n:], strict=True):
        result[2 + n + k] = g
    return result


def _states_loop(ctx: GradContext, node: Node, body: Graph, n: int) -> list[int]:
    """1. The carried values entering each iteration, stacked: the body again, with its
    carried inputs as scan outputs."""
    scope = ctx.scope
    scanned = len(node.outputs) - n  # scan outputs: one value per iteration, stacked
    state = node.inputs[2 : 2 + n]
    ctx.scope = f"{scope}/states"
    ins = [_like(ctx, i, "in") for i in body.inputs]
    states = Graph(name=ctx.scope, inputs=list(ins), outputs=[], nodes=[])
    sub = ctx.child(ctx.add_graph(states))
    mapping = dict(zip(body.inputs, ins, strict=True))
    _clone(sub, body, mapping)
    scans = [sub.op(OpCode.IDENTITY, [v]) for v in ins[2 : 2 + n]]
    states.outputs = [mapping.get(o, o) for o in body.outputs] + scans
    fill_inferred_shapes(ctx.model, ctx.model.graphs.index(states))
    ctx.scope = scope
    stacks = ctx.op_multi(
        OpCode.LOOP,
        node.inputs,
        2 * n + scanned,
        body=ctx.model.graphs.index(states),
        num_carried=n,
    )
    return _typed(ctx, stacks, [*state, *node.outputs[n:], *state])[n + scanned :]


def _backward_body(
    ctx: GradContext, node: Node, body: Graph, trips: int, n: int, select: list[int]
) -> int:
    """2. The backward body (its graph index): step j differentiates iteration t = T-1-j
    at its inputs, carrying the carried values' gradients and summing the implicit
    inputs' (those at `select`)."""
    from sporenet.lite.autodiff.engine import append_vjp  # the engine imports the rules

    state, implicit = node.inputs[2 : 2 + n], node.inputs[2 + n :]
    scope = ctx.scope
    ctx.scope = f"{scope}/backward"
    j = ctx.tensor("j", np.int64)
    keep = ctx.tensor("keep", np.bool_)
    d_in = [_like(ctx, v, "dv") for v in state]
    acc_in = [_like(ctx, implicit[k], "dc") for k in select]
    stack_in = [_like(ctx, v, "stack", (trips,)) for v in state]
    dscan_in = [_like(ctx, y, "dscan") for y in node.outputs[n:]]
    c_in = [_like(ctx, c, "c") for c in implicit]
    back = Graph(
        name=ctx.scope,
        inputs=[j, keep, *d_in, *acc_in, *stack_in, *dscan_in, *c_in],
        outputs=[],
        nodes=[],
    )
    gi = ctx.add_graph(back)
    sub = ctx.child(gi)
    t = sub.op(OpCode.SUB, [sub.constant("last", np.int64(trips - 1), np.int64), j])
    v_t = [sub.op(OpCode.GATHER, [s, t], axis=0) for s in stack_in]
    mapping = dict(zip(body.inputs, [t, keep, *v_t, *c_in], strict=True))
    _clone(sub, body, mapping)
    outs = [mapping.get(o, o) for o in body.outputs[1:]]
    dys = [*d_in, *(sub.op(OpCode.GATHER, [d, t], axis=0) for d in dscan_in)]
    seeds: dict[int, int] = {}
    for y, dy in zip(outs, dys, strict=True):  # one tensor given out twice: gradients add
        seeds[y] = sub.op(OpCode.ADD, [seeds[y], dy]) if y in seeds else dy
    wrt = [*v_t, *(c_in[k] for k in select)]
    found = append_vjp(ctx.model, gi, seeds, wrt)
    ctx.adopt_names()
    sums = [sub.op(OpCode.ADD, [a, found[c_in[k]]]) for a, k in zip(acc_in, select, strict=True)]
    back.outputs = [sub.op(OpCode.IDENTITY, [keep]), *(found[v] for v in v_t), *sums]
    fill_inferred_shapes(ctx.model, gi)  # the nodes added after the vjp
    ctx.scope = scope
    return gi
