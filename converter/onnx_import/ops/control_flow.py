"""If and Loop: their ONNX subgraphs become IR subgraphs (Model.graphs) of the same file.

Outer-scope values a subgraph reads become explicit trailing inputs of the node and of the
subgraph (constants stay shared). An If whose condition is known at conversion is inlined:
only the taken branch is imported, into the enclosing graph.
"""

from __future__ import annotations

import numpy as np
import onnx

from sporenet.converter.errors import ConversionError
from sporenet.converter.onnx_import.context import ImportContext
from sporenet.converter.onnx_import.node import OnnxNode
from sporenet.lite.graph import Graph
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.ops import OpCode


def _import_body(sub: ImportContext, body: onnx.GraphProto, node: OnnxNode) -> list[int]:
    """Import a subgraph's nodes into `sub`; returns the tensors of its outputs."""
    from sporenet.converter.onnx_import.importer import import_nodes, initializer_value

    for tensor in body.initializer:  # a subgraph's own initializers shadow outer names
        value = initializer_value(tensor, sub.data)
        sub.scope.names[tensor.name] = sub.constant(tensor.name, value)
    outer_where = sub.where
    import_nodes(sub, body.node)
    sub.where = outer_where
    outputs = []
    for value in body.output:
        index = sub.scope.lookup(value.name)
        if index is None:
            raise node.fail(f"subgraph {body.name!r} output {value.name!r} is never produced")
        outputs.append(index)
    return outputs


def _specs(ctx: ImportContext, index: int) -> list[TensorSpec]:
    return [view[index] for view in ctx.views]


def _describe(spec: TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape)}"


Branch = tuple[ImportContext, list[int], str]
"""An imported If branch: its subcontext, its output tensors and its ONNX graph name."""


def _branch_graph(ctx: ImportContext, branch: Branch, implicit: list[int]) -> int:
    """Store an If branch as a subgraph taking every implicit input of the node, in order."""
    sub, outs, name = branch
    inputs = [
        sub.scope.captured[o] if o in sub.scope.captured else sub.input_like(o) for o in implicit
    ]
    return ctx.add_subgraph(
        Graph(name=name or "branch", inputs=inputs, outputs=outs, nodes=sub.nodes)
    )


def _check_same_shapes(node: OnnxNode, then: Branch, other: Branch) -> None:
    (then_ctx, then_outs, _), (else_ctx, else_outs, _) = then, other
    if len(then_outs) != len(else_outs):
        raise node.fail(
            f"the then branch gives {len(then_outs)} outputs, the else branch {len(else_outs)}"
        )
    for k, (a, b) in enumerate(zip(then_outs, else_outs, strict=True)):
        for sa, sb in zip(_specs(then_ctx, a), _specs(else_ctx, b), strict=True):
            if (sa.shape, sa.dtype) != (sb.shape, sb.dtype):
                raise node.fail(
                    f"output {k} ({node.outputs[k]!r}) is {_describe(sa)} in the then branch "
                    f"but {_describe(sb)} in the else branch; sporenet plans one shape per "
                    "tensor: fix the input shapes with --input-shape so that the condition is "
                    "known at conversion"
                )


def if_(ctx: ImportContext, node: OnnxNode) -> list[int]:
    cond = node.input(0)
    bodies = {"then": node.attrs["then_branch"], "else": node.attrs["else_branch"]}
    known = ctx.value(cond)
    if known is not None:
        if known.size != 1:
            raise node.fail(f"the condition must hold one element, got shape {list(known.shape)}")
        taken = bodies["then" if bool(known.reshape(-1)[0]) else "else"]
        return _import_body(ctx.subcontext(inline=True), taken, node)
    imported: dict[str, Branch] = {}
    errors: dict[str, str] = {}
    for key, body in bodies.items():
        sub = ctx.subcontext()
        try:
            imported[key] = (sub, _import_body(sub, body, node), body.name)
        except ConversionError as exc:
            # A branch that cannot run at these input shapes (onnxruntime fails there too)
            # is stored as graph -1 with the reason; the kernel raises it when taken.
            errors[key] = str(exc)
    if not imported:
        raise ConversionError(errors["then"])
    if len(imported) == 2:
        _check_same_shapes(node, imported["then"], imported["else"])
    sub, outs, _ = next(iter(imported.values()))
    out_specs = [_specs(sub, o) for o in outs]
    implicit = list(dict.fromkeys(o for b in imported.values() for o in b[0].scope.captured))
    attrs: dict[str, int | str] = {
        f"{key}_graph": _branch_graph(ctx, imported[key], implicit) if key in imported else -1
        for key in bodies
    }
    attrs.update({f"{key}_error": message for key, message in errors.items()})
    return ctx.emit_control(OpCode.IF, [cond, *implicit], out_specs, **attrs)


def _loop_node(
    ctx: ImportContext,
    node: OnnxNode,
    sub: ImportContext,
    explicit: list[int],
    outs: list[int],
    inputs: tuple[int, int, list[int]],
    steps: list[int] | None,
) -> list[int]:
    """Check a converted body against its carried values and emit the LOOP node.

    `explicit` are the body's own inputs (iteration, cond, carried...), `outs` its outputs
    (cond, carried..., scan...), `inputs` the node's (trip count, cond, carried initial
    values) and `steps` the trip count under each assignment of the dynamic dimensions
    when it follows them (a count computed from an input's shape) or is a constant."""
    trip, cond, carried = inputs
    out_specs = []
    for k, outer in enumerate(carried):
        for before, after in zip(_specs(ctx, outer), _specs(sub, outs[1 + k]), strict=True):
            if (before.shape, before.dtype) != (after.shape, after.dtype):
                raise node.fail(
                    f"loop-carried value {k} enters as {_describe(before)} and leaves the body "
                    f"as {_describe(after)}; sporenet plans one shape per tensor"
                )
        out_specs.append([TensorSpec(s.shape, s.dtype) for s in _specs(ctx, outer)])
    scans = outs[1 + len(carried) :]
    if scans:
        if steps is None:
            raise node.fail(
                "scan outputs need a trip count (input M) known at conversion or computed "
                "from the input shapes"
            )
        out_specs += [
            [TensorSpec((t, *s.shape), s.dtype) for t, s in zip(steps, _specs(sub, i), strict=True)]
            for i in scans
        ]
    implicit = list(sub.scope.captured)
    graph = Graph(
        name=f"{node.name}/body",
        inputs=[*explicit, *(sub.scope.captured[o] for o in implicit)],
        outputs=outs,
        nodes=sub.nodes,
    )
    return ctx.emit_control(
        OpCode.LOOP,
        [trip, cond, *carried, *implicit],
        out_specs,
        body=ctx.add_subgraph(graph),
        num_carried=len(carried),
    )


def _body_context(ctx: ImportContext, names: list[str], carried: list[int]) -> ImportContext:
    """A subcontext with a loop body's own inputs: iteration, cond, the carried values."""
    sub = ctx.subcontext()
    sub.graph_input(f"{names[0]}", (), np.dtype(np.int64))
    sub.graph_input(f"{names[1]}", (), np.dtype(np.bool_))
    for name, outer in zip(names[2:], carried, strict=True):
        sub.input_like(outer, name)
    for name, index in zip(names, sub.inputs, strict=False):
        if name:
            sub.scope.names[name] = index
    return sub


def scan(ctx: ImportContext, node: OnnxNode) -> list[int]:
    """Scan (opset 9+, axis 0, forward) as a LOOP whose body gathers element i of each
    scanned input and whose trip count is the scanned length."""
    if node.opset < 9:
        raise node.fail(
            "Scan before opset 9 (with a batch axis and sequence_lens) is not supported"
        )
    body: onnx.GraphProto = node.attrs["body"]
    m = int(node.attr("num_scan_inputs"))
    n = len(node.inputs) - m
    for attr in (
        "scan_input_axes",
        "scan_input_directions",
        "scan_output_axes",
        "scan_output_directions",
    ):
        values = node.ints(attr) or []
        if any(v != 0 for v in values):
            raise node.fail(f"{attr} {values}: only axis 0, forward, is supported")
    if not 0 <= n <= len(node.inputs) or len(body.input) != len(node.inputs):
        raise node.fail(
            f"the body takes {len(body.input)} inputs for {len(node.inputs)} "
            f"node inputs ({m} scanned)"
        )
    states, scanned = node.inputs[:n], node.inputs[n:]
    steps = _scanned_lengths(ctx, node, scanned)
    names = [v.name for v in body.input]
    sub = _body_context(ctx, [f"{node.name}/iteration", f"{node.name}/cond", *names[:n]], states)
    explicit = list(sub.inputs)
    iteration = explicit[0]
    for name, outer in zip(names[n:], scanned, strict=True):
        sub.where = ctx.where
        sub.scope.names[name] = sub.emit1(
            OpCode.GATHER, [sub.scope.capture(outer), iteration], axis=0
        )
    outs = _import_body(sub, body, node)
    keep = ctx.constant(f"{node.name}/keep_going", np.array(True))
    if len(set(steps)) == 1:
        trip = ctx.constant(f"{node.name}/trip_count", np.array(steps[0], np.int64))
    else:  # the scanned length follows a dynamic input dimension: its Shape, planned then
        trip = ctx.emit1(OpCode.SHAPE, [scanned[0]], start=None, end=1)
        ctx.set_view_values(trip, [np.array([t], np.int64) for t in steps])
    return _loop_node(ctx, node, sub, explicit, [keep, *outs], (trip, -1, states), steps)


def _scanned_lengths(ctx: ImportContext, node: OnnxNode, scanned: list[int]) -> list[int]:
    """The scanned inputs' common length on axis 0 under each assignment of the dynamic
    dimensions (one value when it is static)."""
    steps = []
    for view in ctx.views:
        lengths = {view[i].shape[0] if view[i].rank else -1 for i in scanned}
        if len(lengths) != 1 or -1 in lengths:
            raise node.fail(f"scanned inputs need one length on axis 0, got {sorted(lengths)}")
        steps.append(lengths.pop())
    return steps


def loop(ctx: ImportContext, node: OnnxNode) -> list[int]:
    body: onnx.GraphProto = node.attrs["body"]
    trip, cond, carried = node.input(0), node.input(1), node.inputs[2:]
    n = len(carried)
    if len(body.input) != 2 + n:
        raise node.fail(f"the body takes {len(body.input)} inputs, expected 2 + {n} carried")
    if len(body.output) < 1 + n:
        raise node.fail(f"the body gives {len(body.output)} outputs, fewer than 1 + {n} carried")
    if -1 in carried:
        raise node.fail("a loop-carried initial value is absent")
    sub = _body_context(ctx, [v.name for v in body.input], carried)
    explicit = list(sub.inputs)
    outs = _import_body(sub, body, node)
    counts = ctx.view_values(trip) if trip != -1 else None
    steps = None
    if counts is not None and all(c.size == 1 for c in counts):
        steps = [max(int(c.reshape(-1)[0]), 0) for c in counts]
    return _loop_node(ctx, node, sub, explicit, outs, (trip, cond, carried), steps)
