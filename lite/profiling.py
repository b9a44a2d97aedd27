"""Where a model's time goes: each step of a plan timed on its own, summed by op.

    python -m sporenet.lite.profiling model.spore [--repeats 20] [--top 15]

`profile(interpreter)` runs the interpreter's current plan `repeats` times on the inputs
already set (zeros by default) and times every step with the thread's CPU clock; the
median over the repeats is the figure per step. A step is named by its op, its kernel
class and its first input's and output's shapes, so a slow depthwise layer shows its
kernel size and layout. The plan runs unchanged: the timing wraps the calls from outside.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sporenet.lite.interpreter import Interpreter
from sporenet.lite.kernels.base import Kernel
from sporenet.lite.threads import BLAS


@dataclass(frozen=True)
class StepTime:
    """One step of a plan: its position, what it runs, and its median time."""

    position: int
    op: str
    kernel: str
    shapes: str
    seconds: float


def _name(kernel: Kernel) -> str:
    """The kernel class, and the strategy a convolution chose (conv_strategy.py)."""
    strategy = getattr(kernel, "strategy", None)
    name = type(kernel).__name__
    return f"{name} {strategy.name.lower()}" if strategy is not None else name


def _shapes(kernel: Kernel) -> str:
    first = next((s for s in kernel.inputs if s is not None), None)
    ins = "x".join(map(str, first.shape)) if first is not None else "-"
    outs = ",".join("x".join(map(str, s.shape)) for s in kernel.output_specs)
    window = getattr(kernel, "win", None) or getattr(kernel, "layer", None)
    kernel_size = getattr(window, "kernel", None)
    if window is not None and kernel_size is not None:
        strides = "x".join(map(str, window.strides))
        return f"{ins} -> {outs} k{'x'.join(map(str, kernel_size))} s{strides}"
    return f"{ins} -> {outs}"


def profile(
    interpreter: Interpreter,
    repeats: int = 20,
    clock: Callable[[], float] = time.thread_time,
) -> list[StepTime]:
    """Median time of every step of the interpreter's plan over `repeats` runs."""
    planned = interpreter._plan
    if planned is None:
        raise ValueError("the plan waits for the values of shape-like inputs: invoke once first")
    steps, kernels = planned.steps, planned.step_kernels
    times: list[list[float]] = [[] for _ in steps]
    # The BLAS pool bounded as invoke() bounds it: an unbounded pool's threads spin on a
    # busy machine and the caller's clock counts the spinning.
    with BLAS.limit(interpreter.num_threads):
        for _ in range(repeats):
            for k, step in enumerate(steps):
                start = clock()
                step()
                times[k].append(clock() - start)
    return [
        StepTime(k, kernel.op.name, _name(kernel), _shapes(kernel), statistics.median(t))
        for k, (kernel, t) in enumerate(zip(kernels, times, strict=True))
    ]


def by_op(times: list[StepTime]) -> list[tuple[str, int, float]]:
    """(op and kernel class, steps, total seconds), the costliest first."""
    totals: dict[str, list[float]] = defaultdict(list)
    for t in times:
        totals[f"{t.op} ({t.kernel})"].append(t.seconds)
    rows = [(name, len(s), sum(s)) for name, s in totals.items()]
    return sorted(rows, key=lambda r: -r[2])


def report(times: list[StepTime], top: int = 15) -> str:
    """The per-op totals, then the `top` slowest steps, as text."""
    total = sum(t.seconds for t in times) or 1e-12
    lines = [f"{len(times)} steps, {total * 1e3:.3f} ms in all", "", "by op:"]
    for name, count, seconds in by_op(times):
        lines.append(f"  {seconds * 1e3:9.3f} ms {100 * seconds / total:5.1f}%  x{count:<4} {name}")
    lines += ["", f"slowest {top} steps:"]
    for t in sorted(times, key=lambda t: -t.seconds)[:top]:
        step = f"#{t.position:<4} {t.op} ({t.kernel}) {t.shapes}"
        lines.append(f"  {t.seconds * 1e3:9.3f} ms  {step}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .spore file")
    parser.add_argument("--repeats", type=int, default=20, help="runs to take the median of")
    parser.add_argument("--top", type=int, default=15, help="slowest steps to list")
    args = parser.parse_args(argv)
    interpreter = Interpreter(model_path=args.model, num_threads=1)
    rng = np.random.default_rng(0)
    for d in interpreter.get_input_details():
        dtype, shape = np.dtype(d["dtype"]), tuple(d["shape"])
        value = rng.uniform(-1, 1, shape) if dtype.kind == "f" else np.zeros(shape)
        interpreter.set_tensor(d["index"], value.astype(dtype))
    interpreter.invoke()
    print(report(profile(interpreter, args.repeats), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
