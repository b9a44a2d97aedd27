"""Per-node time of a sporenet model: where an Interpreter's run spends its time.

The runtime has no profiler of its own (a timed step would slow every call), so this
re-plans the model with each kernel's bound step wrapped in a timer and then calls the
steps many times. Scripts run as `python benchmarks/NAME.py` import it as `_profile`.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from sporenet.lite import Interpreter
from sporenet.lite.kernels import INT16_KERNELS, KERNELS, QUANTIZED_KERNELS
from sporenet.lite.kernels.base import Kernel


@dataclass
class StepTime:
    """One planned step: its kernel, a label (op, strategy, shapes) and its median time."""

    label: str
    seconds: float


def _label(kernel: Kernel) -> str:
    op = kernel.op.name
    shapes = "x".join(str(d) for d in kernel.output_specs[0].shape) if kernel.output_specs else ""
    detail = getattr(kernel, "strategy", "")
    if op == "CONV2D":
        w = kernel.inputs[1]
        k = "x".join(str(d) for d in w.shape[2:]) if w is not None else "?"
        s = getattr(getattr(kernel, "win", None), "strides", (1, 1))
        detail = f"{detail} k{k} s{s[0]}"
    return f"{op} {detail} -> {shapes}".replace("  ", " ")


@contextmanager
def _timed_binds(
    record: list[tuple[str, list[float]]], clock: Callable[[], float]
) -> Iterator[None]:
    """While active, every kernel's bind returns its step wrapped in a timer."""
    classes = {*KERNELS.values(), *QUANTIZED_KERNELS.values(), *INT16_KERNELS.values()}
    own = {cls: cls.__dict__.get("bind") for cls in classes}
    originals = {cls: cls.bind for cls in classes}

    def wrap(orig: Callable) -> Callable:
        def bind(self: Kernel, inputs: list, outputs: list) -> Callable[[], None] | None:
            step = orig(self, inputs, outputs)
            if step is None:
                return None
            times: list[float] = []
            record.append((_label(self), times))

            def timed() -> None:
                t0 = clock()
                step()
                times.append(clock() - t0)

            return timed

        return bind

    for cls, orig in originals.items():
        cls.bind = wrap(orig)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, orig in own.items():
            if orig is None:
                del cls.bind
            else:
                cls.bind = orig  # type: ignore[method-assign]


def profile(
    model_content: bytes,
    feeds: dict[str, np.ndarray],
    runs: int = 50,
    *,
    cpu: bool = False,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> list[StepTime]:
    """`statistic` (median, or min) of every planned step's time over `runs` calls, in
    plan order, on one thread. cpu=True times the thread's CPU time instead of the wall
    clock: on a loaded machine a step's wall time counts the time slices other processes
    took."""
    clock = time.thread_time if cpu else time.perf_counter
    record: list[tuple[str, list[float]]] = []
    with _timed_binds(record, clock):
        interp = Interpreter(model_content=model_content, num_threads=1)
        interp.run(feeds)  # plans at the feeds' shapes (a re-plan records new steps)
    record.clear()
    with _timed_binds(record, clock):
        interp.allocate_tensors()
    for _, times in record:
        times.clear()  # nodes folded while planning ran their step once, at plan time
    for _ in range(runs):
        interp.run(feeds)
    return [StepTime(label, statistic(t)) for label, t in record if t]


def profile_calls(
    plan: Callable[[], Callable[[int], object]],
    runs: int = 50,
    *,
    cpu: bool = False,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> tuple[list[StepTime], float]:
    """Like profile, for anything that runs planned kernels (a lite Trainer's steps):
    `plan()` builds it with every kernel's bind timed and returns `call(k)`, which runs
    once to plan at its shapes and then `runs` times (k = 1, 2, ...). Returns the steps
    in plan order and `statistic` of the whole call's time (kernels plus dispatch)."""
    clock = time.thread_time if cpu else time.perf_counter
    record: list[tuple[str, list[float]]] = []
    with _timed_binds(record, clock):
        call = plan()
        call(0)
    for _, times in record:
        times.clear()
    totals = []
    for k in range(1, runs + 1):
        t0 = clock()
        call(k)
        totals.append(clock() - t0)
    return [StepTime(label, statistic(t)) for label, t in record if t], statistic(totals)


def summary(steps: list[StepTime], top: int = 15) -> str:
    """Time by op kind (op and strategy) and the slowest single steps, as text."""
    total = sum(s.seconds for s in steps)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for s in steps:
        by_kind[s.label.split(" -> ")[0]].append(s.seconds)
    lines = [f"steps {len(steps)}, sum of medians {total * 1e3:.3f} ms"]
    for kind, ts in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        lines.append(
            f"  {sum(ts) * 1e3:8.3f} ms {100 * sum(ts) / total:5.1f}%  n={len(ts):<3} {kind}"
        )
    lines.append("  slowest steps:")
    for s in sorted(steps, key=lambda s: -s.seconds)[:top]:
        lines.append(f"  {s.seconds * 1e6:8.1f} us  {s.label}")
    return "\n".join(lines)
