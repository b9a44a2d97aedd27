"""Control flow over tensors: cond, fori_loop, scan and while_loop.

    y = cloud.cond(x_sum > 0, lambda x: x * 2.0, lambda x: -x, x)
    h = cloud.fori_loop(100, lambda i, h: ops.tanh(ops.matmul(h, w)), h0)

Python's own `if` and `for` run at trace time, so a traced graph would hold the branch
taken or every iteration unrolled. These combinators capture the control flow instead:
in graph mode as one IR IF or LOOP node whose subgraphs hold each branch or the body
once, whatever the trip count; in eager mode they run the branch taken or the iterations
op by op (the unrolled reference). Values the functions read from outside (a layer's
parameters, earlier Vars) become the node's implicit inputs, so gradients reach them.
Gradients: IF and the LOOP of fori_loop and scan have rules
(lite/autodiff/rules/control_flow.py);
a while_loop, whose trip count values decide, runs forward only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sporenet.cloud.errors import ConfigError, TraceError
from sporenet.cloud.tape import Tape, Var, as_vars
from sporenet.lite.ops import OpCode


def _tape_of(values: list[Var], what: str) -> Tape:
    tapes = {id(v.tape): v.tape for v in values}
    if len(tapes) != 1:
        raise TraceError(f"{what}: its values must belong to one tape, got {len(tapes)}")
    return next(iter(tapes.values()))


def _result(values: list[Var], single: bool) -> Any:
    return values[0] if single else tuple(values)


def cond(
    pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], *operands: Var
) -> Any:
    """true_fn(*operands) if pred else false_fn(*operands); both return the same number
    of Vars of the same shapes and dtypes. `pred` is a one-element bool Var (or a Python
    bool, which just picks the branch)."""
    if not isinstance(pred, Var):
        return (true_fn if bool(pred) else false_fn)(*operands)
    tape = pred.tape
    if tape.eager:
        return (true_fn if bool(np.asarray(pred.numpy()).reshape(-1)[0]) else false_fn)(*operands)
    ops = [_check_var(v, "cond operand") for v in operands]
    records = []
    for name, fn in (("then", true_fn), ("else", false_fn)):
        leading = [tape.fresh(f"cond/{name}/x", v) for v in ops]
        records.append(tape.subgraph(f"cond/{name}", fn, leading))
    then, other = records
    if len(then.outputs) != len(other.outputs):
        raise TraceError(
            f"cond: the true branch gives {len(then.outputs)} values, the false branch "
            f"{len(other.outputs)}"
        )
    implicit = list(dict.fromkeys([*then.captures, *other.captures]))
    graphs = [tape.finish(r, implicit) for r in records]
    outs = tape.op(
        OpCode.IF,
        [pred, *ops, *(Var(tape, i, tape.values.get(i)) for i in implicit)],
        num_outputs=len(then.outputs),
        then_graph=graphs[0],
        else_graph=graphs[1],
    )
    return _result(_typed(tape, outs, [v.index for v in then.outputs]), then.single)


def _typed(tape: Tape, outs: Any, likes: list[int]) -> list[Var]:
    """The node's outputs as a list, given the dtypes of `likes` (the subgraph outputs or
    carried values they are): the graph is validated before shapes are inferred."""
    outs = outs if isinstance(outs, list) else [outs]
    for out, like in zip(outs, likes, strict=True):
        tape.builder.tensors[out.index].dtype = tape.builder.tensors[like].dtype
    return outs


def _same_count(result: Any, carried: tuple[Var, ...], what: str) -> list[Var]:
    values, _ = as_vars(result, what)
    if len(values) != len(carried):
        raise TraceError(f"{what} gives {len(values)} values for {len(carried)} carried ones")
    return values


def _check_var(v: Any, what: str) -> Var:
    if not isinstance(v, Var):
        raise TraceError(f"{what} must be a Var, got {type(v).__name__}")
    return v


def _loop(
    tape: Tape,
    name: str,
    step: Callable[..., list[Var]],
    init: list[Var],
    trip: Var | None,
    keep: Var | None,
) -> tuple[list[Var], list[Var]]:
    """One LOOP node: `step(iteration, keep, *carried)` gives (keep', carried'...,
    scanned...); returns the final carried values and the scanned ones stacked over the
    iterations (the LOOP's scan outputs)."""
    leading = [
        tape.fresh(f"{name}/i", shape=(), dtype=np.int64),
        tape.fresh(f"{name}/keep", shape=(), dtype=np.bool_),
        *(tape.fresh(f"{name}/v", v) for v in init),
    ]
    record = tape.subgraph(name, step, leading)
    if len(record.outputs) < 1 + len(init):
        raise TraceError(
            f"{name}: the body gives {len(record.outputs) - 1} values for {len(init)} carried ones"
        )
    scanned = record.outputs[1 + len(init) :]
    implicit = list(record.captures)
    body = tape.finish(record, implicit)
    outs = tape.op(
        OpCode.LOOP,
        [trip, keep, *init, *(Var(tape, i, tape.values.get(i)) for i in implicit)],
        num_outputs=len(init) + len(scanned),
        body=body,
        num_carried=len(init),
    )
    outs = _typed(tape, outs, [v.index for v in (*init, *scanned)])
    return outs[: len(init)], outs[len(init) :]


def fori_loop(trips: int, body_fn: Callable[..., Any], init: Any) -> Any:
    """Carry `init` (a Var or tuple of Vars) through body_fn(i, *carried) `trips` times;
    i is the iteration as an int64 scalar Var. Differentiable: the gradient is one LOOP
    over the body's vjp, not `trips` copies of it."""
    if not isinstance(trips, int | np.integer) or isinstance(trips, bool) or trips < 0:
        raise ConfigError(f"`trips` must be a non-negative int, got {trips!r}")
    values, single = as_vars(init, "fori_loop's init")
    tape = _tape_of(values, "fori_loop")
    if tape.eager:
        for k in range(int(trips)):
            i = tape.constant("i", np.array(k, np.int64))
            values, _ = as_vars(body_fn(i, *values), "fori_loop's body")
        return _result(values, single)

    def step(i: Var, keep: Var, *carried: Var) -> list[Var]:
        return [keep, *_same_count(body_fn(i, *carried), carried, "fori_loop's body")]

    trip = tape.constant("fori_loop/trips", np.array(int(trips), np.int64))
    return _result(_loop(tape, "fori_loop", step, values, trip, None)[0], single)


def scan(body_fn: Callable[..., Any], init: Any, length: int) -> tuple[Any, Any]:
    """fori_loop that also collects a value per iteration: body_fn(i, *carried) returns
    (carried', y), y a Var or a tuple of Vars; scan returns (the final carried values,
    each y stacked over the `length` iterations on a new axis 0). Differentiable; the
    stacked values' shapes must not depend on the batch."""
    if not isinstance(length, int | np.integer) or isinstance(length, bool) or length < 1:
        raise ConfigError(f"`length` must be a positive int, got {length!r}")
    values, single = as_vars(init, "scan's init")
    tape = _tape_of(values, "scan")
    one = {"y": True}

    def split(result: Any) -> tuple[list[Var], list[Var]]:
        if not isinstance(result, tuple) or len(result) != 2:
            raise TraceError("scan's body must return (carried, y)")
        carried, _ = as_vars(result[0], "scan's carried values")
        ys, one["y"] = as_vars(result[1], "scan's y")
        return carried, ys

    if tape.eager:
        rows = []
        for k in range(int(length)):
            i = tape.constant("i", np.array(k, np.int64))
            values, ys = split(body_fn(i, *values))
            rows.append([tape.op(OpCode.UNSQUEEZE, [y], axes=[0]) for y in ys])
        stacked = [
            col[0] if len(col) == 1 else tape.op(OpCode.CONCAT, list(col), axis=0)
            for col in zip(*rows, strict=True)
        ]
        return _result(values, single), _result(stacked, one["y"])

    def step(i: Var, keep: Var, *carried: Var) -> list[Var]:
        nxt, ys = split(body_fn(i, *carried))
        return [keep, *nxt, *ys]

    trip = tape.constant("scan/length", np.array(int(length), np.int64))
    final, stacked = _loop(tape, "scan", step, values, trip, None)
    return _result(final, single), _result(stacked, one["y"])


def while_loop(cond_fn: Callable[..., Var], body_fn: Callable[..., Any], init: Any) -> Any:
    """Carry `init` through body_fn(*carried) while cond_fn(*carried) (a one-element bool
    Var) holds. Forward only: with a trip count that values decide, it has no gradient
    (use fori_loop for a differentiable loop)."""
    values, single = as_vars(init, "while_loop's init")
    tape = _tape_of(values, "while_loop")
    if tape.eager:
        while bool(np.asarray(_check_var(cond_fn(*values), "cond_fn's result").numpy()).all()):
            values, _ = as_vars(body_fn(*values), "while_loop's body")
        return _result(values, single)

    def step(i: Var, keep: Var, *carried: Var) -> list[Var]:
        nxt = _same_count(body_fn(*carried), carried, "while_loop's body")
        return [_check_var(cond_fn(*nxt), "cond_fn's result"), *nxt]

    first = _check_var(cond_fn(*values), "cond_fn's result")
    return _result(_loop(tape, "while_loop", step, values, None, first)[0], single)
