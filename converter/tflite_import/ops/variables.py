"""TFLite resource variables and CALL_ONCE: streaming state kept between runs.

A variable (VAR_HANDLE's container and shared name) becomes one IR constant tensor whose
data is its initial value: ASSIGN_VARIABLE is an IR ASSIGN that writes it in place, and
READ_VARIABLE a READ_VARIABLE node copying it (readers after a later assignment keep
what was read, as in TFLite). The runtime gives such tensors writable storage that lives
as long as the Interpreter, so values persist between invokes; `reset_all_variables`
restores the initial values.

Inside an IF branch or a WHILE body (an IR subgraph, planned on its own) a variable is a
threaded value instead (control_flow.py): its current value enters the subgraph as an
extra input (a loop-carried value for WHILE), READ_VARIABLE takes the value threaded so
far, ASSIGN_VARIABLE replaces it, and the subgraph's last value leaves as an extra
output that the enclosing graph assigns back, in the order TFLite runs them.

CALL_ONCE runs its init subgraph on the first invoke, which in the models converters
write assigns each variable a constant: that subgraph is evaluated here, at conversion,
and its assignments become the variables' initial values (a value it cannot compute from
constants is refused).
"""

from __future__ import annotations

import numpy as np

from sporenet.converter.tflite_import.layout import LayoutContext, identity, quantization
from sporenet.converter.tflite_import.ops.common import Shared
from sporenet.converter.tflite_import.reader import TfliteOperator, TfliteTensor
from sporenet.lite.graph import DYNAMIC, Node, Quantization
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.ops import OpCode

MAX_NESTING = 16
"""Subgraph imports (CALL_ONCE, IF, WHILE) nested deeper than this are refused."""


def _shared(lc: LayoutContext) -> Shared:
    shared = lc.shared
    if not isinstance(shared, Shared):
        raise lc.fail("resource variables need the model's shared import state")
    return shared


def threaded(lc: LayoutContext) -> dict[str, int] | None:
    """The variables threaded through the detached subgraph being imported, or None
    (the main graph, or an init subgraph: the Interpreter's variables themselves)."""
    shared = _shared(lc)
    if shared.detached and not shared.initializing and shared.threads:
        return shared.threads[-1]
    return None


def _key(lc: LayoutContext, resource: int) -> str:
    shared = _shared(lc)
    key = shared.handles.get((lc.graph.index, resource))
    if key is None:
        raise lc.fail(f"input {lc.tensor(resource).name!r} is not a VAR_HANDLE output")
    thread = threaded(lc)
    if shared.detached and not shared.initializing and (thread is None or key not in thread):
        raise lc.fail(
            f"variable {key!r} is used in an IF branch or WHILE body without being threaded "
            "through it (a handle without a shared name)"
        )
    return key


def handle_key(container: str, name: str) -> str | None:
    """A named variable's key (its container and shared name), or None for a handle
    without a name (a variable of its own, keyed by its operator)."""
    return f"{container}/{name}" if name else None


def _names(op: TfliteOperator) -> tuple[str, str]:
    o = op.options
    container = (o.Container() or b"").decode("utf-8", "replace") if o is not None else ""
    name = (o.SharedName() or b"").decode("utf-8", "replace") if o is not None else ""
    return container, name


def var_handle(lc: LayoutContext, op: TfliteOperator) -> None:
    key = handle_key(*_names(op)) or f"{lc.where}/{lc.tensor(op.outputs[0]).name}"
    _shared(lc).handles[(lc.graph.index, op.outputs[0])] = key
    lc.held[op.outputs[0]] = (-1, ())  # a handle: no IR value


def subgraph_variables(
    lc: LayoutContext, indices: list[int], passed: dict[int, str]
) -> dict[str, TfliteTensor]:
    """The named variables the TFLite subgraphs `indices` (and those they run) read or
    assign, each with the first tensor read from or assigned to it there. `passed`: the
    keys of the handles the subgraphs take as inputs, by position (handles they pass on
    to their own IF and WHILE are followed too)."""
    from sporenet.converter.tflite_import.reader import SUBGRAPH_FIELDS

    found: dict[str, TfliteTensor] = {}
    known: dict[int, dict[int, str]] = {}  # subgraph -> its handle tensors' keys
    for index in indices:
        inputs = lc.model.subgraphs[index].inputs
        known[index] = {inputs[k]: key for k, key in passed.items() if k < len(inputs)}
    order = list(indices)
    for index in order:
        graph = lc.model.subgraphs[index]
        keys = known[index]
        for op in graph.operators:
            if op.op == "VAR_HANDLE":
                key = handle_key(*_names(op))
                if key is not None:
                    keys[op.outputs[0]] = key
                continue
            operands = op.inputs[1:] if op.op == "IF" else op.inputs
            for field in SUBGRAPH_FIELDS.get(op.op, ()):
                target = int(getattr(op.options, field)())
                if op.op == "CALL_ONCE" or not 0 <= target < len(lc.model.subgraphs):
                    continue
                targets = lc.model.subgraphs[target].inputs
                given = {
                    targets[k]: keys[t]
                    for k, t in enumerate(operands)
                    if t in keys and k < len(targets)
                }
                if target not in known:
                    known[target] = given
                    order.append(target)
                else:
                    known[target].update(given)
            if op.op in ("READ_VARIABLE", "ASSIGN_VARIABLE") and op.inputs:
                key = keys.get(op.inputs[0])
                like = op.outputs[0] if op.op == "READ_VARIABLE" else op.inputs[-1]
                if key is not None and key not in found and like != -1:
                    found[key] = graph.tensors[like]
    return found


def current_value(lc: LayoutContext, key: str, like: TfliteTensor) -> int:
    """The IR tensor holding variable `key`'s value at this point of the enclosing graph:
    the value threaded so far, or a READ_VARIABLE of the variable."""
    thread = threaded(lc)
    if thread is not None:
        if key not in thread:
            raise lc.fail(f"variable {key!r} is not threaded through the enclosing subgraph")
        return thread[key]
    var = _variable(lc, key, like)
    spec = lc.ctx.spec(var)
    quant = lc.ctx.tensors[var].quantization
    return lc.raw(OpCode.READ_VARIABLE, [var], spec.shape, spec.dtype, quant, {})


def write_back(lc: LayoutContext, key: str, ir: int) -> None:
    """Variable `key` takes the value `ir` a subgraph left it with."""
    thread = threaded(lc)
    if thread is not None:
        thread[key] = ir
        return
    var = _shared(lc).variables[key]
    lc.ctx.nodes.append(
        Node(op=OpCode.ASSIGN, inputs=[var, ir], outputs=[], attrs={}, name=f"{lc.where}/assign")
    )


def _variable(lc: LayoutContext, key: str, like: int | TfliteTensor) -> int:
    """The IR tensor of variable `key`, created at its first use with its initial value
    (CALL_ONCE's, else zeros of `like`, the TFLite tensor first assigned to it)."""
    shared = _shared(lc)
    if key in shared.variables:
        return shared.variables[key]
    t = lc.tensor(like) if isinstance(like, int) else like
    if t.dtype is None:
        raise lc.fail(f"variable {key!r} holds {t.type_name} values")
    # The stored values are read as they are (TFLite copies bytes), with the parameters
    # of the tensors the main graph reads and assigns.
    quant = quantization(t.quant, identity(len(t.shape)))
    data = shared.initial[key][0] if key in shared.initial else np.zeros(t.shape, t.dtype)
    if data.dtype != t.dtype or data.shape != tuple(t.shape):
        raise lc.fail(
            f"variable {key!r} is initialized to {data.dtype}{list(data.shape)} and used as "
            f"{t.dtype}{list(t.shape)}"
        )
    data = np.ascontiguousarray(data)
    data.flags.writeable = False
    ctx = lc.ctx
    specs = [TensorSpec(data.shape, data.dtype, quant=quant)] * len(ctx.views)
    index = ctx._add(f"variable/{key}", specs, data)
    ctx.tensors[index].quantization = quant
    shared.variables[key] = index
    return index


def read_variable(lc: LayoutContext, op: TfliteOperator) -> None:
    key, out = _key(lc, op.inputs[0]), op.outputs[0]
    shared = _shared(lc)
    thread = threaded(lc)
    if thread is not None:  # the value threaded so far through this subgraph
        _check_like(lc, key, thread[key], out, "reads")
        lc.set(out, thread[key])
        return
    if shared.initializing:  # within an init subgraph: the value assigned so far
        if key not in shared.initial:
            raise lc.fail(f"variable {key!r} is read before it is assigned")
        data, quant = shared.initial[key]
        ir = lc.ctx.constant(lc.tensor(out).name, data)
        lc.set_quantization(ir, quant)
        lc.set(out, ir)
        return
    if key not in shared.variables and key not in shared.initial:
        raise lc.fail(f"variable {key!r} is read before any assignment (no CALL_ONCE sets it)")
    var = _variable(lc, key, out)
    t, spec = lc.tensor(out), lc.ctx.spec(var)
    if t.dtype != spec.dtype or tuple(t.shape) != tuple(spec.shape):
        raise lc.fail(
            f"reads {t.dtype}{list(t.shape)} from variable {key!r} of "
            f"{spec.dtype}{list(spec.shape)}"
        )
    quant = lc.ctx.tensors[var].quantization
    if not _same(quant, quantization(t.quant, identity(len(t.shape)))):
        raise lc.fail(f"reads variable {key!r} with other quantization parameters than it has")
    lc.set(out, lc.raw(OpCode.READ_VARIABLE, [var], spec.shape, spec.dtype, quant, {}))


def _check_like(lc: LayoutContext, key: str, current: int, tensor: int, verb: str) -> None:
    """A threaded variable is read and assigned as it is: same dtype, shape, parameters."""
    t, spec = lc.tensor(tensor), lc.ctx.spec(current)
    if t.dtype != spec.dtype or tuple(t.shape) != tuple(spec.shape):
        raise lc.fail(
            f"{verb} {t.dtype}{list(t.shape)} from/to variable {key!r} of "
            f"{spec.dtype}{list(spec.shape)}"
        )
    if not _same(
        lc.ctx.tensors[current].quantization, quantization(t.quant, identity(len(t.shape)))
    ):
        raise lc.fail(f"{verb} variable {key!r} with other quantization parameters than it has")


def _same(a: Quantization | None, b: Quantization | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        np.array_equal(a.scale, b.scale)
        and np.array_equal(a.zero_point, b.zero_point)
        and a.axis == b.axis
    )


def assign_variable(lc: LayoutContext, op: TfliteOperator) -> None:
    key = _key(lc, op.inputs[0])
    value = op.inputs[1]
    shared = _shared(lc)
    ir = lc.get(value)  # variables hold TFLite's axis order
    thread = threaded(lc)
    if thread is not None:
        _check_like(lc, key, thread[key], value, "assigns")
        thread[key] = ir
        return
    if shared.initializing:
        data = lc.ctx.value(ir)
        if data is None:
            raise lc.fail(
                f"the init subgraph assigns variable {key!r} a value not known at conversion"
            )
        shared.initial[key] = (np.array(data), lc.ctx.tensors[ir].quantization)
        return
    var = _variable(lc, key, value)
    have, given = lc.ctx.spec(var), lc.ctx.spec(ir)
    if have.dtype != given.dtype or have.shape != given.shape:
        raise lc.fail(
            f"assigns {given.dtype}{list(given.shape)} to variable {key!r} of "
            f"{have.dtype}{list(have.shape)}"
        )
    lc.ctx.nodes.append(
        Node(op=OpCode.ASSIGN, inputs=[var, ir], outputs=[], attrs={}, name=f"{lc.where}/assign")
    )


def call_once(lc: LayoutContext, op: TfliteOperator) -> None:
    # The importer imports the op handlers, so it is imported here, when it is needed.
    from sporenet.converter.tflite_import.importer import import_operators

    shared = _shared(lc)
    index = int(op.options.InitSubgraphIndex())
    if index in shared.called:
        return
    if shared.depth >= MAX_NESTING or shared.initializing:
        raise lc.fail(f"init subgraph {index} is nested in another subgraph import")
    graph = lc.model.subgraphs[index]
    if graph.inputs or graph.outputs:
        raise lc.fail(f"init subgraph {index} has inputs or outputs; CALL_ONCE passes none")
    shared.called.add(index)
    shared.initializing, shared.depth = True, shared.depth + 1
    try:
        # Its nodes go to a scratch context and are dropped: only the values it assigns,
        # computed from constants as they are imported, are kept.
        import_operators(lc.sub(graph, lc.ctx.subcontext()))
    finally:
        shared.initializing, shared.depth = False, shared.depth - 1
    lc.ctx.where = lc.where


def state_variable(lc: LayoutContext, index: int) -> int:
    """The IR variable of a TFLite variable tensor (a recurrent op's state): zeros at
    first, as TFLite allocates them, kept between invokes."""
    t = lc.tensor(index)
    if lc.shared is not None and _shared(lc).detached:
        raise lc.fail("recurrent state inside IF branches and WHILE bodies is not supported")
    if t.data is not None or not t.is_variable:
        raise lc.fail(f"state input {t.name!r} must be a variable tensor without data")
    if DYNAMIC in t.signature:
        raise lc.fail(f"state input {t.name!r} has a dynamic shape {list(t.signature)}")
    return _variable(lc, f"{lc.graph.index}/{t.name}#{index}", index)
