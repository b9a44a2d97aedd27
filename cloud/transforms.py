"""Function transformations: grad, value_and_grad, vjp, jvp, jacobian, hessian.

    from sporenet import cloud
    from sporenet.cloud import ops
    df = cloud.grad(lambda x, w: ops.sum(ops.tanh(ops.matmul(x, w))), argnums=1)
    df(x, w)                      # d/dw, a NumPy array

A transformed function takes NumPy arrays or Vars. On arrays it runs in the mode of the
one switch (`set_mode`): eagerly, op by op, or as one IR graph traced and planned once per
input signature (`.graph(*args)` returns that Model; values f closes over are taken when
it is traced, so pass what changes as arguments). On Vars it records its forward and
backward nodes on their tape, so transformations compose: `grad(grad(f))` differentiates
the backward nodes of `grad(f)`, which works wherever those nodes have gradient rules
(docs/autodiff.md lists which ops support a second derivative today).

The gradient is always an IR graph that lite's autodiff engine built
(`lite.autodiff.append_vjp`); eager mode runs the same nodes one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sporenet.cloud.errors import ConfigError, TraceError
from sporenet.cloud.mode import get_mode
from sporenet.cloud.module import Module
from sporenet.cloud.tape import Tape, Var
from sporenet.lite.autodiff import append_gradients, append_vjp
from sporenet.lite.errors import LiteError, UnsupportedOpError
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode

Tree = Any  # a Var or array, or a tuple of Trees


def vjp_vars(
    outputs: Sequence[Var], inputs: Sequence[Var], cotangents: Sequence[Var] | None = None
) -> list[Var]:
    """Record the vector-Jacobian product on the inputs' tape: one gradient Var per input,
    sum over outputs of cotangent . d output / d input. Without cotangents, the single
    output must be a scalar (the gradient of a loss)."""
    tape = _common_tape([*outputs, *inputs, *(cotangents or ())])
    model = tape.live_model()
    first = len(tape.builder.nodes)
    wrt = [v.index for v in inputs]
    try:
        if cotangents is None:
            if len(outputs) != 1:
                raise ConfigError(f"a gradient needs one scalar output, got {len(outputs)}")
            grads = append_gradients(model, 0, outputs[0].index, wrt, infer_shapes=not tape.eager)
        else:
            if len(cotangents) != len(outputs):
                raise ConfigError(
                    f"expected one cotangent per output ({len(outputs)}), got {len(cotangents)}"
                )
            seeds: dict[int, int] = {}
            for out, ct in zip(outputs, cotangents, strict=True):
                if out.index in seeds:  # the same output twice: its cotangents add up
                    ct = tape.op(OpCode.ADD, [Var(tape, seeds[out.index], None), ct])
                seeds[out.index] = ct.index
            grads = append_vjp(model, 0, seeds, wrt, infer_shapes=not tape.eager)
    except UnsupportedOpError as exc:
        raise UnsupportedOpError(
            f"cannot differentiate this function: {exc}. A higher derivative needs rules for "
            "the backward ops of the first (docs/autodiff.md lists the ops that have them)"
        ) from None
    except LiteError as exc:
        raise TraceError(f"cannot differentiate this function: {exc}") from exc
    finally:
        tape.adopt(model)
    if tape.eager:
        tape.run_nodes(tape.builder.nodes[first:])
    return [Var(tape, grads[v.index], tape.values.get(grads[v.index])) for v in inputs]


def _common_tape(vars_: Sequence[Var]) -> Tape:
    tapes = {id(v.tape): v.tape for v in vars_}
    if len(tapes) != 1:
        raise TraceError("the function's inputs and outputs must belong to one tape")
    return next(iter(tapes.values()))


def _argnums(argnums: int | Sequence[int], count: int) -> tuple[list[int], bool]:
    """The positions to differentiate and whether one was asked for (not a tuple)."""
    single = isinstance(argnums, int)
    nums: list[int] = [argnums] if isinstance(argnums, int) else list(argnums)
    for k in nums:
        if not isinstance(k, int) or not -count <= k < count:
            raise ConfigError(f"`argnums` entry {k!r} is out of range for {count} arguments")
    return [k % count for k in nums], single


def _scalar(out: Any, name: str) -> Var:
    if not isinstance(out, Var):
        raise TraceError(f"{name}: the function must return a Var, got {type(out).__name__}")
    return out


def _leaves(tree: Tree) -> list[Any]:
    if isinstance(tree, tuple | list):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def _rebuild(tree: Tree, leaves: Any) -> Tree:
    if isinstance(tree, tuple | list):
        return tuple(_rebuild(item, leaves) for item in tree)
    return next(leaves)


class Transformed:
    """A function of Vars, callable on NumPy arrays (eager or graph mode) or on Vars."""

    def __init__(self, on_vars: Callable[..., Tree], name: str) -> None:
        self.on_vars = on_vars
        self.__name__ = name
        self._plans: dict[tuple, tuple[Any, Tree, list[str]]] = {}

    def __call__(self, *args: Any) -> Tree:
        if any(isinstance(a, Var) for a in args):
            return self.on_vars(*args)
        arrays = [_array(a) for a in args]
        if get_mode() == "eager":
            tape = Tape(eager=True)
            result = self.on_vars(*[tape.input(f"arg{k}", a) for k, a in enumerate(arrays)])
            return _rebuild(result, iter(v.numpy() for v in _leaves(result)))
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        if key not in self._plans:
            from sporenet.lite.interpreter import Interpreter

            model, tree, names = self._trace(arrays)
            self._plans[key] = (Interpreter(model=model), tree, names)
        interpreter, tree, names = self._plans[key]
        outs = interpreter.run({f"arg{k}": a for k, a in enumerate(arrays)})
        return _rebuild(tree, iter(outs[n] for n in names))

    def graph(self, *args: Any) -> Model:
        """The IR Model this function runs as in graph mode, for inputs like `args`
        (inputs "arg0", "arg1", ...; outputs "out0", "out1", ... in the result's order)."""
        return self._trace([_array(a) for a in args])[0]

    def _trace(self, arrays: list[np.ndarray]) -> tuple[Model, Tree, list[str]]:
        tape = Tape(eager=False)
        inputs = [tape.input(f"arg{k}", shape=a.shape, dtype=a.dtype) for k, a in enumerate(arrays)]
        result = self.on_vars(*inputs)
        produced = {o for node in tape.builder.nodes for o in node.outputs}
        outputs, names, seen = [], [], set()
        for k, var in enumerate(_leaves(result)):
            if not isinstance(var, Var):
                raise TraceError(f"{self.__name__}: results must be Vars, got {type(var)}")
            if var.index not in produced or var.index in seen:  # a graph input, constant or repeat
                var = tape.op(OpCode.IDENTITY, [var])
            seen.add(var.index)
            outputs.append((var, f"out{k}"))
            names.append(f"out{k}")
        return tape.model(outputs), result, names

    def __repr__(self) -> str:
        return f"<sporenet transformed function {self.__name__}>"


def _array(a: Any) -> np.ndarray:
    array = np.asarray(a)
    if array.dtype.kind not in "fiub":
        raise ConfigError(f"arguments must be numeric arrays, got {array.dtype}")
    return array if array.flags.c_contiguous else array.copy()  # 0-d stays 0-d


def functional_call(module: Module, params: dict[str, Var], x: Var) -> Var:
    """module(x) with the parameters or buffers named in `params` ("0.weight", ...) taken
    from those Vars instead of the module's arrays, so a transformation can differentiate
    with respect to them: grad(lambda w, x: loss(functional_call(net, {"0.weight": w}, x)))."""
    state = dict(module.named_state())
    unknown = sorted(set(params) - set(state))
    if unknown:
        raise ConfigError(f"no parameters {unknown} in the module; it has {sorted(state)}")
    tape = x.tape
    saved: dict[int, int | None] = {}
    for name, var in params.items():
        if not isinstance(var, Var) or var.tape is not tape:
            raise TraceError(f"parameter {name!r} must be a Var of the input's tape")
        key = id(state[name])
        saved[key] = tape.params.get(key)
        tape.params[key] = var.index
        tape.param_objects[key] = state[name]
    try:
        return module(x)
    finally:
        for key, index in saved.items():
            if index is None:
                del tape.params[key]
            else:
                tape.params[key] = index


def function(f: Callable[..., Tree]) -> Transformed:
    """f as a function of NumPy arrays, run in the mode of the switch (graph mode traces
    it once per input signature and runs the planned IR graph)."""
    return Transformed(f, getattr(f, "__name__", "f"))


def value_and_grad(f: Callable[..., Var], argnums: int | Sequence[int] = 0) -> Transformed:
    """f's value and its gradient with respect to the arguments at `argnums` (one gradient,
    or a tuple when `argnums` is a tuple). f must return a scalar Var."""

    def on_vars(*args: Var) -> Tree:
        nums, single = _argnums(argnums, len(args))
        out = _scalar(f(*args), "value_and_grad")
        grads = vjp_vars([out], [args[k] for k in nums])
        return out, grads[0] if single else tuple(grads)

    return Transformed(on_vars, f"value_and_grad({getattr(f, '__name__', 'f')})")


def grad(f: Callable[..., Var], argnums: int | Sequence[int] = 0) -> Transformed:
    """The gradient of scalar-valued f with respect to the arguments at `argnums`."""
    both = value_and_grad(f, argnums)
    return Transformed(lambda *args: both.on_vars(*args)[1], f"grad({both.__name__[15:-1]})")


def vjp(f: Callable[..., Tree], *primals: Any) -> tuple[Tree, Callable[..., Tree]]:
    """f(*primals) and a function mapping cotangents (one per output, shaped like it) to
    the gradient of every primal."""
    if any(isinstance(p, Var) for p in primals):
        outs = _leaves(f(*primals))

        def pull_vars(*cotangents: Var) -> Tree:
            return tuple(vjp_vars(outs, list(primals), list(cotangents)))

        return (outs[0] if len(outs) == 1 else tuple(outs)), pull_vars

    count = len(primals)

    def on_vars(*args: Var) -> Tree:
        xs, cts = args[:count], args[count:]
        return tuple(vjp_vars(_leaves(f(*xs)), list(xs), list(cts)))

    pull = Transformed(on_vars, f"vjp({getattr(f, '__name__', 'f')})")
    value = Transformed(lambda *xs: f(*xs), getattr(f, "__name__", "f"))(*primals)
    return value, lambda *cotangents: pull(*primals, *cotangents)


def jvp(f: Callable[..., Tree], primals: Sequence[Any], tangents: Sequence[Any]) -> Tree:
    """(f(*primals), J t): the Jacobian-vector product, computed as the vjp of the vjp
    (the vjp is linear in its cotangent u, and the gradient of <vjp(u), t> in u is J t).
    That differentiates the backward nodes of f with respect to u, so it needs their
    gradient rules: an UnsupportedOpError names the backward ops that lack one."""
    if len(primals) != len(tangents):
        raise ConfigError(f"got {len(primals)} primals and {len(tangents)} tangents")
    count = len(primals)

    def on_vars(*args: Var) -> Tree:
        xs, ts = list(args[:count]), list(args[count:])
        outs = _leaves(f(*xs))
        # A zero cotangent that depends on nothing the second vjp differentiates.
        us = [
            v.tape.op(OpCode.MUL, [v, v.tape.constant("zero", _zero(v), keep_dtype=True)])
            for v in outs
        ]
        pulled = vjp_vars(outs, xs, us)
        pushed = vjp_vars(pulled, us, ts)
        value = outs[0] if len(outs) == 1 else tuple(outs)
        return value, pushed[0] if len(pushed) == 1 else tuple(pushed)

    transformed = Transformed(on_vars, f"jvp({getattr(f, '__name__', 'f')})")
    return transformed(*primals, *tangents)


def _zero(v: Var) -> np.ndarray:
    return np.zeros((), v.tape.spec(v)[1])


def jacobian(f: Callable[..., Var], argnums: int | Sequence[int] = 0) -> Transformed:
    """The Jacobian of f (one output Var) with respect to the arguments at `argnums`:
    shaped output.shape + argument.shape, one vjp per output element (reverse mode).
    Shapes must be static (no dynamic batch)."""

    def on_vars(*args: Var) -> Tree:
        nums, single = _argnums(argnums, len(args))
        out = _scalar(f(*args), "jacobian")
        tape = out.tape
        shape, dtype = tape.spec(out)
        if -1 in shape:
            raise ConfigError("jacobian needs static shapes; the output has a dynamic dimension")
        size = int(np.prod(shape))
        rows: list[list[Var]] = [[] for _ in nums]
        for j in range(size):
            onehot = np.zeros(size, dtype)
            onehot[j] = 1
            ct = tape.constant("onehot", onehot.reshape(shape), keep_dtype=True)
            for r, g in zip(rows, vjp_vars([out], [args[k] for k in nums], [ct]), strict=True):
                r.append(g.reshape(1, -1))
        result = []
        for k, r in zip(nums, rows, strict=True):
            stacked = r[0] if len(r) == 1 else tape.op(OpCode.CONCAT, r, axis=0)
            result.append(stacked.reshape((*shape, *tape.spec(args[k])[0])))
        return result[0] if single else tuple(result)

    return Transformed(on_vars, f"jacobian({getattr(f, '__name__', 'f')})")


def hessian(f: Callable[..., Var], argnums: int = 0) -> Transformed:
    """The Hessian of scalar-valued f: jacobian(grad(f)). Needs second-order rules for
    every backward op of f (docs/autodiff.md)."""
    return jacobian(grad(f, argnums), argnums)
