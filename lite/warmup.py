"""Warming a plan up when it is made, so the first call costs what later calls cost.

The first run of a plan pays costs that belong to the process, not to the inputs: NumPy
resolves and caches the inner loop of every ufunc and dtype it meets, the BLAS library
allocates its buffers on its first product, CPython specializes the bytecode of the steps
and of the calling path only after several executions. On a model whose call takes a
fraction of a millisecond they make the first call several times slower than the next.
Running the plan on zero inputs while the model loads (where onnxruntime-style users
expect set-up time) pays them there.

The warm-up is best effort within a time budget, so a large model, whose one-time costs
are small beside a call, loads no slower than it would after one or two of its steps:

- the first and the last run go over the plan's own steps: every step, even where an
  earlier one fails on zeros (a branch that cannot run at zero inputs, an index computed
  from zeros: the real call raises its own error), subgraph plans directly, and every If
  branch by the If's own path (its `warm_steps`), as zero inputs reach only one branch;
- the runs between go through the caller's own path (set the inputs, run, copy the
  outputs) on zeros, a step that fails there skipped as well, so the whole path runs;
- a plan holding a Loop whose trip count is not a planned constant warms only its
  subgraphs: a condition computed from zeros could keep it looping;
- floating-point warnings of the zero runs are silenced;
- a model whose graphs write state (weights, optimizer slots, a dropout's step counter)
  is not warmed: a run on zeros must change nothing a caller sees.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np

from sporenet.lite.graph import Model
from sporenet.lite.planner import Compute, ExecutionPlan
from sporenet.lite.variables import WRITTEN_INPUTS

BUDGET_SECONDS = 0.005
"""CPU time a warm-up may start runs and steps in (the step running when it ends
completes); CPU time, so that other processes' load does not cut the warm-up short."""

LOAD_SHARE = 0.3
"""A warm-up's budget is at most this share of the CPU time the load took before it, so
warming up adds at most about a third to a model's load."""


def budget_for(load_seconds: float) -> float:
    """The warm-up budget after a load (or re-plan) that took `load_seconds` of CPU."""
    return min(BUDGET_SECONDS, LOAD_SHARE * max(load_seconds, 0.0))


REPEATS = 8
"""Runs in all: CPython specializes a function's bytecode only after several executions
(3.11 quickens a code object on its eighth), so a single run leaves later calls faster."""


def writes_state(model: Model) -> bool:
    """Whether a graph of `model` writes state a run leaves behind (weights, optimizer
    slots, running statistics, a dropout's step counter): a warm-up would change it."""
    return any(node.op in WRITTEN_INPUTS for g in model.graphs for node in g.nodes)


def warm_up(
    plan: ExecutionPlan, call: Callable[[], object] | None = None, budget: float = BUDGET_SECONDS
) -> None:
    """Run `plan` on zero inputs `REPEATS` times within `budget` seconds of CPU time: first
    and last over its own steps (every step, every If branch by its own path, subgraph
    plans), between them by `call` (the caller's path, on zeros; a step that fails on
    zeros is skipped there too), or over the steps again when `call` itself fails. Ending
    with every branch leaves none colder in the caches than the one zero inputs take.

    The plan's input arrays hold zeros afterwards; its outputs hold whatever the zero
    inputs produced."""
    deadline = time.process_time() + budget
    if not _bounded(plan):
        call = None
    steps = plan.steps
    with np.errstate(all="ignore"):
        for run in range(REPEATS):
            if time.process_time() > deadline:
                break
            if call is not None and 0 < run < REPEATS - 1:
                plan.steps = [_skipping_errors(step) for step in steps]
                try:
                    call()
                    continue
                except Exception:  # zeros the caller's own checks refuse
                    call = None
                finally:
                    plan.steps = steps
            _warm(plan, deadline)


def _skipping_errors(step: Compute) -> Compute:
    """`step`, where an error (a step that cannot run on zeros) ends only this step: the
    real call raises its own."""

    def run() -> None:
        with contextlib.suppress(Exception):
            step()

    return run


def _subplans(plan: ExecutionPlan) -> list[ExecutionPlan]:
    return [sub for kernel in plan.kernels for sub in kernel.subplans]


def _bounded(plan: ExecutionPlan) -> bool:
    """Whether running `plan` on any inputs does an amount of work the plan fixes: no
    Loop, in it or in its subgraphs, repeats a number of times its inputs decide."""
    return all(k.trip_count_planned for k in plan.kernels) and all(
        _bounded(sub) for sub in _subplans(plan)
    )


def _warm(plan: ExecutionPlan, deadline: float) -> None:
    for i in plan.inputs:
        plan.arrays[i].fill(0)
    for sub in _subplans(plan):
        _warm(sub, deadline)
    if not _bounded(plan):
        return
    extra = [step for kernel in plan.kernels for step in kernel.warm_steps]
    for step in [*plan.steps, *extra]:
        if time.process_time() > deadline:
            return
        try:
            step()
        except Exception:  # a step that cannot run on zeros is skipped
            continue
