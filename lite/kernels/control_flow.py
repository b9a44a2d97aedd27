"""Control flow: If and Loop run subgraphs of the same model file (ONNX semantics).

Each subgraph is planned once, when the node is prepared, with the shapes its node feeds
it; running the node copies the node's inputs into the subgraph plan's input buffers, runs
the plan and copies its outputs out. Shapes are static per plan: If branches must agree on
their output shapes (unless the condition is a constant, then only the taken branch is
planned), Loop-carried values keep their shape across iterations, and scan outputs need a
trip count known when the model is planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sporenet.lite.errors import ShapeError
from sporenet.lite.kernels import raw
from sporenet.lite.kernels.base import REQUIRED, Attrs, Compute, Kernel, TensorSpec, required
from sporenet.lite.ops import OpCode
from sporenet.lite.opset.decl import derived_map

SUBGRAPH_ATTRIBUTES = derived_map(lambda d: d.subgraphs or None)
"""The attributes of each op that name a subgraph by its graph index (declared with the
op, lite/opset/)."""


def _plan_subgraph(kernel: Kernel, name: str, feeds: Sequence[TensorSpec]) -> Any:
    """Plan the subgraph named by attribute `name` for inputs described by `feeds`."""
    from sporenet.lite.planner import plan_graph  # the planner imports the kernel registry

    model = kernel.attrs.model
    if model is None:
        raise kernel.fail("runs subgraphs and must be planned with its model")
    gi = kernel.attrs.int(name, REQUIRED)
    if not 0 < gi < len(model.graphs):
        raise kernel.fail(f"{name} {gi} is not a subgraph index (1..{len(model.graphs) - 1})")
    graph = model.graphs[gi]
    if len(graph.inputs) != len(feeds):
        raise kernel.fail(
            f"{name} {gi} ({graph.name!r}) takes {len(graph.inputs)} inputs, the "
            f"node gives {len(feeds)}"
        )
    for k, (i, spec) in enumerate(zip(graph.inputs, feeds, strict=True)):
        declared = model.tensors[i].dtype
        if spec.dtype != declared:
            raise kernel.fail(
                f"{name} {gi} input {k} ({model.tensors[i].name!r}) is {declared}, "
                f"the node gives {spec.dtype}"
            )
    shapes = {i: spec.shape for i, spec in zip(graph.inputs, feeds, strict=True)}
    try:
        return plan_graph(model, gi, shapes)
    except ShapeError as exc:
        raise kernel.fail(f"{name} {gi} ({graph.name!r}): {exc}") from None


def _scalar_flag(spec: TensorSpec | None, what: str, kernel: Kernel) -> bool | None:
    """The constant value of a one-element condition, or None when it is known only at run
    time (or absent)."""
    if spec is None:
        return None
    if spec.size != 1:
        raise kernel.fail(f"{what} must hold one element, got shape {list(spec.shape)}")
    return None if spec.value is None else bool(spec.value.reshape(-1)[0])


class If(Kernel):
    """Runs the then- or else-branch graph on the implicit inputs (inputs 1...)."""

    op = OpCode.IF
    num_inputs = (1, 1 << 16)
    foldable = False  # the subgraphs need the model, which constant folding does not pass

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        known = _scalar_flag(self.input(0), "the condition (input 0)", self)
        feeds = [self.input(k) for k in range(1, len(self.inputs))]
        self.branches: dict[bool, Any] = {}
        self.broken: dict[bool, str] = {}  # branches that cannot run at these shapes
        for name, flag in (("then_graph", True), ("else_graph", False)):
            if known is not None and known != flag:
                continue
            if attrs.int(name, REQUIRED) == -1:
                reason = attrs.str(f"{name[:4]}_error", "no reason recorded")
                self.broken[flag] = (
                    f"the {name[:4]} branch cannot run at these input shapes: {reason}"
                )
            else:
                self.branches[flag] = _plan_subgraph(self, name, feeds)
        if not self.branches:
            raise self.fail(next(iter(self.broken.values())))
        per_branch = {flag: [p.specs[o] for o in p.outputs] for flag, p in self.branches.items()}
        specs = next(iter(per_branch.values()))
        if len(per_branch) == 2:
            then, other = per_branch[True], per_branch[False]
            if len(then) != len(other):
                raise self.fail(
                    f"the then branch has {len(then)} outputs, the else branch {len(other)}"
                )
            for k, (a, b) in enumerate(zip(then, other, strict=True)):
                if (a.shape, a.dtype) != (b.shape, b.dtype):
                    raise self.fail(
                        f"output {k} is {a.dtype}{list(a.shape)} in the then branch but "
                        f"{b.dtype}{list(b.shape)} in the else branch; a planned model needs "
                        "one shape (fix the input shapes so the condition is known when the "
                        "model is converted)"
                    )
        self.output_specs = [TensorSpec(s.shape, s.dtype) for s in specs]
        self.subplans = list(self.branches.values())  # warmed at load (lite/warmup.py)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        cond, feeds = required(inputs, 0), [x for x in inputs[1:] if x is not None]
        broken = self.broken

        copyto = raw.copyto  # plan arrays only: no __array_function__ dispatch

        def through(plan: Any) -> Compute:
            ins = list(zip([plan.arrays[i] for i in plan.inputs], feeds, strict=True))
            outs = list(zip(outputs, [plan.arrays[o] for o in plan.outputs], strict=False))
            run = plan.run

            def run_branch() -> None:
                for d, s in ins:
                    copyto(d, s)
                run()
                for d, s in outs:
                    copyto(d, s)

            return run_branch

        runs = {flag: through(p) for flag, p in self.branches.items()}
        # Every runnable branch by the step's own path, whatever the condition at the
        # warm-up on zero inputs (lite/warmup.py); the then branch last, the path a model
        # usually takes (an else branch tends to hold the fallback).
        self.warm_steps = [runs[flag] for flag in (False, True) if flag in runs]
        if len(runs) == 1 and not broken:
            return next(iter(runs.values()))

        def step() -> None:
            flag = bool(cond.reshape(-1)[0])
            if flag in broken:
                raise ShapeError(f"IF: {broken[flag]}")
            runs[flag]()

        return step


class Loop(Kernel):
    """Runs the body graph while the trip count and the condition allow, carrying values
    from one iteration to the next and stacking scan outputs."""

    op = OpCode.LOOP
    num_inputs = (2, 1 << 16)
    foldable = False

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        self.carried = attrs.int("num_carried", REQUIRED)
        if not 0 <= self.carried <= len(self.inputs) - 2:
            raise self.fail(f"num_carried {self.carried} does not fit {len(self.inputs)} inputs")
        trip = self.optional_input(0)
        if trip is not None and (trip.size != 1 or trip.dtype.kind not in "iu"):
            raise self.fail(
                f"the trip count must be one integer, got {trip.dtype}{list(trip.shape)}"
            )
        _scalar_flag(self.optional_input(1), "the condition (input 1)", self)
        state = [self.input(k) for k in range(2, len(self.inputs))]
        feeds = [TensorSpec((), np.dtype(np.int64)), TensorSpec((), np.dtype(np.bool_)), *state]
        self.body = _plan_subgraph(self, "body", feeds)
        self.subplans = [self.body]  # warmed at load (lite/warmup.py)
        # Whether the iterations are bounded by a constant (else input values decide).
        self.trip_count_planned = trip is not None and trip.value is not None
        outs = [self.body.specs[o] for o in self.body.outputs]
        n = self.carried
        if len(outs) < 1 + n:
            raise self.fail(
                f"the body gives {len(outs)} outputs, fewer than the condition and "
                f"{n} carried values"
            )
        for k in range(n):
            before, after = state[k], outs[1 + k]
            if (before.shape, before.dtype) != (after.shape, after.dtype):
                raise self.fail(
                    f"carried value {k} enters as {before.dtype}{list(before.shape)} and leaves "
                    f"the body as {after.dtype}{list(after.shape)}; a planned loop needs one "
                    "shape across iterations"
                )
        keep_going = outs[0]
        if trip is None and keep_going.value is not None and bool(keep_going.value.all()):
            raise self.fail(
                "has no trip count and its body's condition is always true: it would never end"
            )
        scans = outs[1 + n :]
        self.trips: int | None = None
        if scans:
            if trip is None or trip.value is None:
                raise self.fail(
                    "scan outputs need a trip count (input 0) known when the model is planned"
                )
            self.trips = max(int(trip.value.reshape(-1)[0]), 0)
        self.output_specs = [TensorSpec(s.shape, s.dtype) for s in state[:n]]
        self.output_specs += [TensorSpec((self.trips or 0, *s.shape), s.dtype) for s in scans]

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        trip, cond = inputs[0], inputs[1]
        state = [x for x in inputs[2:] if x is not None]  # all present (checked in prepare)
        body, n = self.body, self.carried
        body_in = [body.arrays[i] for i in body.inputs]
        body_out = [body.arrays[o] for o in body.outputs]
        iteration, keep_in = body_in[0], body_in[1]
        carried_in, carried_out = body_in[2 : 2 + n], body_out[1 : 1 + n]
        scan_out, scans = body_out[1 + n :], outputs[n:]
        # Carried values pass through these: a body may swap or alias its carried values.
        between = [np.empty_like(v) for v in carried_out]
        planned = self.trips

        def step() -> None:
            limit = int(trip.reshape(-1)[0]) if trip is not None else np.iinfo(np.int64).max
            keep = bool(cond.reshape(-1)[0]) if cond is not None else True
            for d, s in zip(body_in[2:], state, strict=True):
                np.copyto(d, s)
            done = 0
            while done < limit and keep:
                if planned is not None and done >= planned:
                    break
                iteration[...] = done
                keep_in[...] = keep
                body.run()
                keep = bool(body_out[0].reshape(-1)[0])
                # Scan outputs first: one may be a view of a carried input (Identity of
                # the previous value), which the next copies overwrite.
                for stack, v in zip(scans, scan_out, strict=True):
                    stack[done] = v
                for t, v in zip(between, carried_out, strict=True):
                    np.copyto(t, v)
                for d, t in zip(carried_in, between, strict=True):
                    np.copyto(d, t)
                done += 1
            if planned is not None and done != planned:
                raise ShapeError(
                    f"LOOP: stopped after {done} iterations, but its scan outputs "
                    f"were planned for {planned}"
                )
            for out, v in zip(outputs[:n], carried_in, strict=True):
                np.copyto(out, v)

        return step


class Call(Kernel):
    """Runs one subgraph on the node's inputs (a function with its own gradient: the
    `grad_graph` attribute is read by the autodiff rule, not here)."""

    op = OpCode.CALL
    num_inputs = (0, 1 << 16)
    foldable = False

    def __init__(self, attrs: Attrs, inputs: Sequence[TensorSpec | None]) -> None:
        super().__init__(attrs, inputs)
        if any(spec is None for spec in inputs):
            raise self.fail("takes no absent inputs")
        self.plan = _plan_subgraph(self, "graph", [s for s in inputs if s is not None])
        self.output_specs = [
            TensorSpec(self.plan.specs[o].shape, self.plan.specs[o].dtype)
            for o in self.plan.outputs
        ]
        self.subplans = [self.plan]  # warmed at load (lite/warmup.py)

    def bind(self, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> Compute:
        plan = self.plan
        dst = [plan.arrays[i] for i in plan.inputs]
        src = [plan.arrays[o] for o in plan.outputs]
        feeds = [x for x in inputs if x is not None]

        def step() -> None:
            for d, x in zip(dst, feeds, strict=True):
                np.copyto(d, x)
            plan.run()
            for out, y in zip(outputs, src, strict=True):
                np.copyto(out, y)

        return step
