"""Functional ops on Vars, for functions the transformations differentiate.

    from sporenet.cloud import ops
    def f(x, w):
        return ops.sum(ops.tanh(ops.matmul(x, w)))

Each function records one IR op on the tape of its first Var (eager tapes run it at once),
the same ops layers record; `apply` records any op code by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.cloud.errors import TraceError
from sporenet.cloud.tape import Var
from sporenet.lite.ops import OpCode


def _var(x: Any, like: Var) -> Var:
    """`x` as a Var on `like`'s tape (a number or array becomes a constant of its dtype)."""
    if isinstance(x, Var):
        return x
    _, dtype = like.tape.spec(like)
    return like.tape.constant("const", np.asarray(x, dtype=dtype), keep_dtype=True)


def apply(op: OpCode, *inputs: Any, num_outputs: int = 1, **attrs: Any) -> Any:
    """Record `op` on its inputs (the first must be a Var; numbers become constants)."""
    first = next((x for x in inputs if isinstance(x, Var)), None)
    if first is None:
        raise TraceError(f"{op.name}: needs at least one Var input, got {inputs!r}")
    return first.tape.op(op, [_var(x, first) for x in inputs], num_outputs=num_outputs, **attrs)


def _unary(op: OpCode) -> Any:
    def fn(x: Var) -> Var:
        return apply(op, x)

    fn.__name__ = op.name.lower()
    fn.__doc__ = f"Elementwise {op.name}."
    return fn


neg = _unary(OpCode.NEG)
exp = _unary(OpCode.EXP)
log = _unary(OpCode.LOG)
sqrt = _unary(OpCode.SQRT)
square = _unary(OpCode.SQUARE)
reciprocal = _unary(OpCode.RECIPROCAL)
abs = _unary(OpCode.ABS)
relu = _unary(OpCode.RELU)
sigmoid = _unary(OpCode.SIGMOID)
tanh = _unary(OpCode.TANH)
silu = _unary(OpCode.SILU)
gelu = _unary(OpCode.GELU)
softplus = _unary(OpCode.SOFTPLUS)


def maximum(a: Any, b: Any) -> Var:
    return apply(OpCode.MAXIMUM, a, b)


def minimum(a: Any, b: Any) -> Var:
    return apply(OpCode.MINIMUM, a, b)


def matmul(a: Var, b: Any) -> Var:
    """Batched matrix product (NumPy's matmul)."""
    return apply(OpCode.MATMUL, a, b)


def _reduce(op: OpCode, x: Var, axis: int | Sequence[int] | None, keepdims: bool) -> Var:
    if axis is None:
        return apply(op, x, keepdims=int(keepdims))
    axes = [axis] if isinstance(axis, int) else [int(a) for a in axis]
    return apply(op, x, axes=axes, keepdims=int(keepdims))


def sum(x: Var, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Var:
    """Sum over `axis` (all axes when None)."""
    return _reduce(OpCode.REDUCE_SUM, x, axis, keepdims)


def mean(x: Var, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Var:
    """Mean over `axis` (all axes when None)."""
    return _reduce(OpCode.REDUCE_MEAN, x, axis, keepdims)


def softmax(x: Var, axis: int = -1) -> Var:
    return apply(OpCode.SOFTMAX, x, axis=axis)


def log_softmax(x: Var, axis: int = -1) -> Var:
    return apply(OpCode.LOG_SOFTMAX, x, axis=axis)


def transpose(x: Var, perm: Sequence[int]) -> Var:
    return apply(OpCode.TRANSPOSE, x, perm=[int(p) for p in perm])


def concat(xs: Sequence[Var], axis: int = 0) -> Var:
    return apply(OpCode.CONCAT, *xs, axis=axis)


def where(condition: Var, a: Any, b: Any) -> Var:
    """a where condition else b (condition a bool Var, e.g. from `greater`)."""
    like = a if isinstance(a, Var) else b
    return condition.tape.op(OpCode.WHERE, [condition, _var(a, like), _var(b, like)])


def greater(a: Any, b: Any) -> Var:
    return apply(OpCode.GREATER, a, b)


def less(a: Any, b: Any) -> Var:
    return apply(OpCode.LESS, a, b)
