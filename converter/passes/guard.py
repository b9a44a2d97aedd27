"""Passes that never break a valid graph: a pass whose result the runtime would reject is
undone, so the converter's output is the graph the passes could rewrite and no worse.

A pass can produce a graph it cannot express (a Tanh fused into an int8 Add, which has no
int8 form; a layout a kernel does not take). `run_guarded` runs the passes as usual and
checks the result once (the structural validator, and every kernel prepared by shape
inference). Only when that check fails does it start again from the graph it was given and
check after every pass, restoring the graph before each pass that breaks it. A graph that
was invalid before any pass runs is not the passes' fault: its error is raised as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.errors import LiteError
from sporenet.lite.graph import Graph, Model, Node, Signature, Tensor
from sporenet.lite.validate import validate

Rewrite = Callable[[Model], int]


@dataclass(frozen=True)
class Snapshot:
    """A model's graph structure at one moment; tensor values are shared, not copied."""

    tensors: list[Tensor]
    graphs: list[Graph]
    signatures: dict[str, Signature]


def _node(node: Node) -> Node:
    return dataclasses.replace(
        node, inputs=list(node.inputs), outputs=list(node.outputs), attrs=dict(node.attrs)
    )


def take(model: Model) -> Snapshot:
    """What restore needs to put `model` back as it is now."""
    return Snapshot(
        tensors=[dataclasses.replace(t) for t in model.tensors],
        graphs=[
            dataclasses.replace(
                g, inputs=list(g.inputs), outputs=list(g.outputs), nodes=[_node(n) for n in g.nodes]
            )
            for g in model.graphs
        ],
        signatures={
            k: dataclasses.replace(s, inputs=dict(s.inputs), outputs=dict(s.outputs))
            for k, s in model.signatures.items()
        },
    )


def restore(model: Model, snapshot: Snapshot) -> None:
    """Put `model` back as it was when `snapshot` was taken (the snapshot stays usable)."""
    again = take(_as_model(snapshot, model))
    model.tensors, model.graphs, model.signatures = again.tensors, again.graphs, again.signatures


def _as_model(snapshot: Snapshot, like: Model) -> Model:
    return dataclasses.replace(
        like, tensors=snapshot.tensors, graphs=snapshot.graphs, signatures=snapshot.signatures
    )


def problem(model: Model) -> LiteError | None:
    """Why the runtime would reject `model` (validator or kernel preparation), or None.
    Leaves the inferred shapes stored on the model's tensors."""
    try:
        validate(model)
        for gi in range(len(model.graphs)):
            fill_inferred_shapes(model, gi)
        validate(model)
    except LiteError as exc:
        return exc
    return None


@dataclass
class GuardedRun:
    """What run_guarded did: rewrites per pass, and the passes it undid, with why."""

    rewrites: dict[str, int]
    undone: dict[str, str]


def _run(model: Model, passes: Sequence[tuple[str, Rewrite]]) -> dict[str, int]:
    return {name: run(model) for name, run in passes}


def run_guarded(model: Model, passes: Sequence[tuple[str, Rewrite]]) -> GuardedRun:
    """Run `passes` (name, rewrite) in order on `model`, in place, undoing any pass whose
    result the runtime rejects. Raises the input's own error if it was already invalid."""
    start = take(model)
    try:
        rewrites = _run(model, passes)
        failure = problem(model)
    except LiteError as exc:
        failure = exc
    if failure is None:
        return GuardedRun(rewrites, {})
    restore(model, start)
    original = problem(model)
    if original is not None:
        raise original
    restore(model, start)
    rewrites, undone = {}, {}
    for name, run in passes:
        before = take(model)
        try:
            rewrites[name] = run(model)
            failure = problem(model)
        except LiteError as exc:
            failure = exc
        if failure is not None:
            restore(model, before)
            rewrites[name] = 0
            undone[name] = str(failure)
    return GuardedRun(rewrites, undone)
