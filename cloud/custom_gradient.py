"""Custom backward rules: a function whose gradient is the user's, not the automatic one.

    def sigmoid_bprop(x, out, dout):          # MindSpore's bprop: inputs, output, d output
        return (dout * out * (1.0 - out),)    # one gradient per input

    @cloud.custom_gradient(sigmoid_bprop)
    def sigmoid(x):
        return 1.0 / (1.0 + ops.exp(-x))

A Module gets the same with a `bprop(self, *inputs, out, dout)` method (Module.__call__).
The function and its bprop are each recorded once as a subgraph and the call as one IR
CALL node whose `grad_graph` is the bprop, so the rule is the same in eager mode, in graph
mode, in the `.spore` training graph and on the device (lite's autodiff rule for CALL
emits a CALL of the bprop). Values the function reads besides its arguments (a layer's
parameters) get no gradient through a custom backward: pass them as arguments to give
them one. The bprop may read only its arguments and constants.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from sporenet.cloud.errors import TraceError
from sporenet.cloud.tape import Tape, Var
from sporenet.lite.ops import OpCode


def custom_gradient(bprop: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable]:
    """Decorate `fn` so that its gradient is `bprop(*inputs, out, dout)`: `out` and `dout`
    are a Var or a tuple of Vars as fn returns; it returns one gradient per input (a Var,
    or a tuple for several inputs; None for no gradient)."""
    if not callable(bprop):
        raise TraceError(f"custom_gradient needs a callable bprop, got {bprop!r}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            if not any(isinstance(a, Var) for a in args):
                from sporenet.cloud.transforms import Transformed

                return Transformed(wrapper, getattr(fn, "__name__", "f"))(*args)
            return call_with_gradient(fn, bprop, args)

        return wrapper

    return decorate


def call_with_gradient(fn: Callable[..., Any], bprop: Callable[..., Any], args: Any) -> Any:
    """Record fn(*args) as a CALL node whose gradient is bprop's (custom_gradient)."""
    tapes = {id(a.tape): a.tape for a in args if isinstance(a, Var)}
    if len(tapes) != 1 or not all(isinstance(a, Var) for a in args):
        raise TraceError("a custom-gradient function takes Vars of one tape")
    tape: Tape = next(iter(tapes.values()))
    name = getattr(fn, "__name__", "custom")
    leading = [tape.fresh(f"{name}/x", a) for a in args]
    forward = tape.subgraph(name, fn, leading)
    captured = list(forward.captures)
    graph = tape.finish(forward, captured)
    outer = [Var(tape, i, tape.values.get(i)) for i in captured]
    outs = [Var(tape, v.index, v.value) for v in forward.outputs]

    xs = [tape.fresh(f"{name}/bprop/x", a) for a in args]
    cs = [tape.fresh(f"{name}/bprop/c", c) for c in outer]
    ys = [tape.fresh(f"{name}/bprop/out", y) for y in outs]
    dys = [_zeros_like(tape, f"{name}/bprop/dout", y) for y in outs]

    def backward(*values: Var) -> list[Var]:
        k, m = len(xs), len(cs)
        x, c, y, dy = (
            values[:k],
            values[k : k + m],
            values[k + m : k + m + len(ys)],
            values[-len(ys) :],
        )
        out, dout = (y[0], dy[0]) if forward.single else (tuple(y), tuple(dy))
        grads = bprop(*x, out, dout)
        grads = [grads] if isinstance(grads, Var) or grads is None else list(grads)
        if len(grads) != len(x):
            raise TraceError(f"{name}'s bprop returned {len(grads)} gradients for {len(x)} inputs")
        filled = [
            g if g is not None else tape.op(OpCode.MUL, [xi, _zero(tape, xi)])
            for g, xi in zip(grads, x, strict=True)
        ]
        # Captured values (parameters) get no gradient through a custom backward.
        zeros = [tape.op(OpCode.MUL, [ci, _zero(tape, ci)]) for ci in c]
        return [*filled, *zeros]

    record = tape.subgraph(f"{name}/bprop", backward, [*xs, *cs, *ys, *dys])
    if record.captures:
        names = [tape.builder.tensors[i].name for i in record.captures]
        raise TraceError(
            f"{name}'s bprop reads {names}, which are neither its arguments nor constants"
        )
    grad_graph = tape.finish(record, [])
    result = tape.op(
        OpCode.CALL, [*args, *outer], num_outputs=len(outs), graph=graph, grad_graph=grad_graph
    )
    result = result if isinstance(result, list) else [result]
    for r, y in zip(result, outs, strict=True):
        tape.builder.tensors[r.index].dtype = tape.builder.tensors[y.index].dtype
    return result[0] if forward.single else tuple(result)


def _zero(tape: Tape, like: Var) -> Var:
    return tape.constant(
        "zero", np.zeros((), tape.builder.tensors[like.index].dtype), keep_dtype=True
    )


def _zeros_like(tape: Tape, name: str, like: Var) -> Var:
    t = tape.builder.tensors[like.index]
    value = np.zeros(like.value.shape, like.value.dtype) if like.value is not None else None
    return tape.fresh(name, shape=t.shape, dtype=t.dtype, value=value)
