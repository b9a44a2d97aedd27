"""The NumPy floor of tiny TFLite models: what their layers cost as bare NumPy calls.

A streaming keyword spotter's invoke is a few dozen layers on a few hundred bytes each;
LiteRT runs one in a few microseconds, while any NumPy call costs a fraction of a
microsecond of dispatch whatever its size. So the latency such a model can reach in
NumPy is bounded below by the calls its layers need, not by their arithmetic. For each
model of the corpus (tflite_corpus.py) named, this script plans the converted model with
sporenet and, for every step of the plan, times the fewest NumPy calls that layer needs
with preallocated arrays of its shapes and no framework around them (copies and dots
through lite/kernels/raw.py, NumPy's cheapest way to call them):

- an int8 convolution or fully connected layer with constant weights: its columns
  gathered into float64 (1 copy), the product with the requantization folded into the
  weights (1 dot, or a row-wise vecdot / batched matmul for depthwise), the clamp and
  the narrowing cast to int8 (2 calls): 4 calls;
- a float fully connected layer: the dot and the bias (2 calls), its activation (1);
- data movement left in the plan (a concatenation's copied part, a split, a variable's
  update, a transpose): 1 copy per output;
- a lookup table (int8 logistic, requantize): 1 take;
- anything else: its planned step as it is.

Then it prints, per model: the planned invoke (`Interpreter.invoke`), the sum of those
bare calls (the floor), LiteRT's invoke, and the ratios, then both engines' whole call
as the corpus benchmark times it (set_tensor, invoke, get_tensor); with the CPU, its
SIMD features, the BLAS kernel NumPy runs (threadpoolctl) and the load average. Medians
of `--repeats` rounds of `--calls` back-to-back calls each, timed with the thread's CPU
clock (a shared machine), the engines alternating, all in this one process, one thread
(OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset: the script re-runs itself without them).

    python benchmarks/numpy_floor.py [--only NAME ...] [--repeats 30] [--calls 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_MODELS = (
    "micro_okay_nabu",
    "micro_alexa",
    "micro_hey_jarvis",
    "micro_hey_mycroft",
    "ok_nabu",
    "hey_rhasspy",
    "sine_float",
)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _clean_environment() -> None:
    """Re-run this script with one BLAS thread and the CPU's own BLAS kernels (see
    real_tflite_models.py), unless it already runs so."""
    if any(k in os.environ for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")) or any(
        os.environ.get(k) != "1" for k in THREAD_VARIABLES
    ):
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
        }
        env.update(dict.fromkeys(THREAD_VARIABLES, "1"))
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _medians_us(
    named: dict[str, Callable[[], object]], repeats: int, calls: int
) -> dict[str, float]:
    """Per name: the median over `repeats` rounds of the mean CPU time of the calling
    thread over `calls` back-to-back calls, in us. The rounds of all names alternate, so
    a shared machine's load falls on each alike."""
    rounds: dict[str, list[float]] = {name: [] for name in named}
    clock = time.thread_time
    for _ in range(repeats):
        for name, call in named.items():
            start = clock()
            for _ in range(calls):
                call()
            rounds[name].append((clock() - start) / calls)
    return {name: statistics.median(r) * 1e6 for name, r in rounds.items()}


def _int8_product(kernel, x_shape, out_shape) -> list[Callable[[], object]]:
    """The 4 bare calls of an int8 layer with constant weights: gather, product, clamp,
    narrowing cast."""
    import numpy as np

    from sporenet.lite.kernels import raw

    w = kernel.inputs[1]
    o = w.shape[0]
    k = int(np.prod(w.shape[1:]))
    p = int(np.prod(out_shape)) // o
    group = getattr(kernel, "group", 1)
    x = np.zeros(x_shape, np.int8)
    size = group * (k + 1) * p
    cols = np.ones(size, np.float64)
    src = np.resize(x.reshape(-1), size - group * p)
    dst = cols[: src.size]
    v = np.zeros(o * p, np.float64)
    out = np.zeros(o * p, np.int8).view(np.uint8)
    zero, top = np.array(0.0), np.array(255.5)
    calls: list[Callable[[], object]] = [lambda: raw.copyto(dst, src)]
    if group == 1:
        weights = np.ones((o, k + 1))
        b = cols.reshape(k + 1, p) if p > 1 else cols
        target = v.reshape(o, p) if p > 1 else v
        calls.append(lambda: raw.dot(weights, b, out=target))
    elif p == 1 and o == group and hasattr(np, "vecdot"):
        weights = np.ones((group, k + 1))
        rows = cols.reshape(group, k + 1)
        calls.append(lambda: np.vecdot(weights, rows, out=v))
    else:
        weights = np.ones((group, o // group, k + 1))
        b3, v3 = cols.reshape(group, k + 1, p), v.reshape(group, o // group, p)
        calls.append(lambda: np.matmul(weights, b3, out=v3))
    clip = getattr(np, "_core", np).umath.clip if hasattr(np, "_core") else np.clip
    calls.append(lambda: clip(v, zero, top, out=v))
    calls.append(lambda: raw.copyto(out, v, casting="unsafe"))
    return calls


def _float_dense(kernel, x_shape, out_shape) -> list[Callable[[], object]]:
    """A float fully connected layer: dot, bias, and its fused activation if any."""
    import numpy as np

    from sporenet.lite.kernels import raw

    w = kernel.inputs[1]
    x = np.zeros(x_shape, np.float32).reshape(-1, w.shape[1])
    weights = np.zeros(w.shape, np.float32).T.copy()
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    bias = np.zeros(w.shape[0], np.float32)
    calls: list[Callable[[], object]] = [
        lambda: raw.dot(x, weights, out=out),
        lambda: np.add(out, bias, out=out),
    ]
    if kernel.attrs.values.get("activation", "none") not in ("none", None):
        calls.append(lambda: np.maximum(out, 0.0, out=out))
    return calls


def bare_calls(kernel, step: Callable[[], None]) -> tuple[str, list[Callable[[], object]]]:
    """The fewest bare NumPy calls of one planned step, and how they were chosen."""
    import numpy as np

    from sporenet.lite.kernels import raw

    op = kernel.op.name
    ins = [s for s in kernel.inputs if s is not None]
    outs = kernel.output_specs
    weighted = len(ins) > 1 and ins[1].value is not None
    if op in ("CONV2D", "FULLY_CONNECTED") and weighted:
        if ins[0].dtype == np.int8:
            return "int8 product", _int8_product(kernel, ins[0].shape, outs[0].shape)
        if op == "FULLY_CONNECTED" and ins[0].dtype == np.float32:
            return "float dense", _float_dense(kernel, ins[0].shape, outs[0].shape)
    if op in ("CONCAT", "SPLIT", "ASSIGN", "TRANSPOSE", "READ_VARIABLE", "RESHAPE", "SLICE"):
        specs = outs if outs else ins[1:2]
        pairs = [(np.zeros(s.shape, s.dtype), np.zeros(s.shape, s.dtype)) for s in specs]
        return "copy", [lambda a=a, b=b: raw.copyto(a, b) for a, b in pairs]
    if type(kernel).__name__ in ("QLogistic", "Requantize", "QTanh") and outs:
        table = np.zeros(256, outs[0].dtype)
        index = np.zeros(outs[0].shape, np.uint8)
        out = np.zeros(outs[0].shape, outs[0].dtype)
        return "lookup", [lambda: table.take(index, out=out)]
    return "as planned", [step]


Labelled = list[tuple[str, Callable[[], object]]]


def _fused_product(kernel, out_shape, first: bool) -> Labelled:
    """An int8 layer in the fused design: its input already float64 codes in its column
    buffer (the producer wrote them there), so the product, the clamp, and a floor into
    the consumer's buffer (exact: v >= 0 after the clamp) are all it needs; the first
    weighted layer of the plan also gathers its int8 input (1 copy)."""
    import numpy as np

    gather, product, clamp = _int8_product(kernel, kernel.inputs[0].shape, out_shape)[:3]
    o = kernel.inputs[1].shape[0]
    p = int(np.prod(out_shape)) // o
    v = np.zeros(o * p, np.float64)
    consumer = np.zeros((o * p, 3), np.float64)[:, 1]  # a strided column of the next buffer
    floor = np.floor
    calls: Labelled = [("gather", gather)] if first else []
    name = "dot" if kernel.attrs.values.get("group", 1) == 1 else "depthwise"
    return [*calls, (name, product), ("clamp", clamp), ("floor", lambda: floor(v, consumer))]


def _fused_lookup(spec) -> Labelled:
    """The start of a chain of lookup tables: a cast of the float64 codes to an index
    and one take from the chain's composed table."""
    import numpy as np

    from sporenet.lite.kernels import raw

    table = np.zeros(256, spec.dtype)
    index = np.zeros(spec.shape, np.intp)
    codes = np.zeros(spec.shape, np.float64)
    out = np.zeros(spec.shape, spec.dtype)
    return [
        ("index", lambda: raw.copyto(index, codes, casting="unsafe")),
        ("lookup", lambda: table.take(index, out=out)),
    ]


def fused_calls(kernel, step: Callable[[], None], state: dict[str, bool]) -> Labelled:
    """The bare calls of one planned step, each labelled, in the fused design that tries
    fewer calls than today's decomposition: int8 tensors between weighted layers held as
    float64 codes inside their consumer's column buffer (no narrowing cast, no gather); a
    streaming state kept inside its concatenation buffer, so the concatenation is free and
    the frame shift is the ASSIGN's one copy; SPLIT, SLICE, RESHAPE, READ_VARIABLE and a
    TRANSPOSE feeding a weighted layer as views; a chain of lookup tables composed into
    one take (plus one cast to an index at its start). `state` carries what the steps
    before have seen."""
    import numpy as np

    op = kernel.op.name
    ins = [s for s in kernel.inputs if s is not None]
    outs = kernel.output_specs
    weighted = len(ins) > 1 and ins[1].value is not None
    lookup = type(kernel).__name__ in ("QLogistic", "Requantize", "QTanh") and bool(outs)
    was_lookup, state["lookup"] = state.get("lookup", False), lookup
    if op in ("CONV2D", "FULLY_CONNECTED") and weighted and ins[0].dtype == np.int8:
        first, state["weighted"] = not state.get("weighted", False), True
        return _fused_product(kernel, outs[0].shape, first)
    if op in ("CONCAT", "SPLIT", "SLICE", "RESHAPE", "READ_VARIABLE", "TRANSPOSE"):
        return []
    if lookup:
        return [] if was_lookup else _fused_lookup(outs[0])
    kind, bare = bare_calls(kernel, step)
    return [(kind, call) for call in bare]


def _blas() -> str:
    import numpy as np
    from threadpoolctl import threadpool_info

    np.dot(np.ones((64, 64)), np.ones((64, 64)))
    found = [
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    return "; ".join(found) or "unknown"


def _cheapest(repeats: int, calls: int) -> tuple[str, float]:
    """The line giving the cost of NumPy's cheapest calls here, and the smallest of them
    in us: the dispatch each bare call of the floor pays at least."""
    import numpy as np

    from sporenet.lite.kernels import raw

    one, eight = np.zeros(1), np.zeros(8, np.int8)
    matrix, vector, product = np.eye(8), np.ones(8), np.empty(8)
    times = _medians_us(
        {
            "add, 1 element": lambda: np.add(one, one, one),
            "copyto, 8 bytes": lambda: raw.copyto(eight, eight),
            "dot, 8x8 @ 8": lambda: raw.dot(matrix, vector, out=product),
        },
        repeats,
        calls,
    )
    return "one call: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()), min(times.values())


def measure(name: str, workdir: Path, repeats: int, calls: int) -> dict:
    """One model: the planned invoke, the floor of its steps and LiteRT's invoke, in us."""
    from real_tflite_models import _feeds, _Litert, _Sporenet
    from tflite_corpus import MANIFEST, fetch

    from sporenet.converter import convert_tflite

    entry = next(e for e in MANIFEST if e.name == name)
    tflite = fetch(entry)
    spore = workdir / f"{name}.spore"
    spore.write_bytes(convert_tflite(str(tflite), input_shapes=dict(entry.shapes) or None))
    feeds = _feeds(str(tflite), dict(entry.shapes))
    ours, theirs = _Sporenet(str(spore)), _Litert(str(tflite), dict(entry.shapes))
    ours.run(feeds)
    plan = ours.it._plan
    kinds: dict[str, int] = {}
    floor_calls: list[Callable[[], object]] = []
    fused: dict[str, list[Callable[[], object]]] = {}
    state: dict[str, bool] = {}
    for kernel, step in zip(plan.step_kernels, plan.steps, strict=True):
        kind, bare = bare_calls(kernel, step)
        kinds[kind] = kinds.get(kind, 0) + len(bare)
        floor_calls += bare
        for label, call in fused_calls(kernel, step, state):
            fused.setdefault(label, []).append(call)

    def floor() -> None:
        for call in floor_calls:
            call()

    def each(calls: list[Callable[[], object]]) -> Callable[[], None]:
        def run() -> None:
            for call in calls:
                call()

        return run

    named = {
        "invoke": ours.it.invoke,
        "floor": floor,
        "fused": each([c for calls in fused.values() for c in calls]),
        **{f"fused {label}": each(calls) for label, calls in fused.items()},
        "litert": theirs.it.invoke,
        "run": lambda: ours.run(feeds),
        "litert_run": lambda: theirs.run(feeds),
    }
    return {
        "steps": len(plan.steps),
        "calls": kinds,
        "fused_calls": {label: len(calls) for label, calls in fused.items()},
        **_medians_us(named, repeats, calls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(DEFAULT_MODELS), help="model names")
    parser.add_argument("--repeats", type=int, default=30, help="rounds per figure")
    parser.add_argument("--calls", type=int, default=50, help="calls per round")
    args = parser.parse_args(argv)
    _clean_environment()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tempfile

    from real_tflite_models import cpu_description

    print(cpu_description())
    print(f"BLAS: {_blas()}; one thread; load average {os.getloadavg()[0]:.1f}")
    print(f"medians of {args.repeats} rounds of {args.calls} calls; times in microseconds")
    cheapest_line, cheapest = _cheapest(args.repeats, args.calls)
    print(cheapest_line)
    print(
        "invoke: Interpreter.invoke (LiteRT: its invoke); floor: the plan's steps as bare "
        "NumPy calls; run: set_tensor, invoke, get_tensor (both engines)"
    )
    header = (
        f"{'model':18} {'steps':>5} {'invoke':>7} {'floor':>6} {'LiteRT':>6} "
        f"{'ours/LR':>7} {'floor/LR':>8} {'run':>6} {'LR run':>6} {'ratio':>6}  bare calls"
    )
    print(header)
    print("-" * len(header))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            r = measure(name, Path(tmp), args.repeats, args.calls)
            rows.append((name, r))
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["calls"].items()))
            print(
                f"{name:18} {r['steps']:5d} {r['invoke']:7.1f} {r['floor']:6.1f} "
                f"{r['litert']:6.1f} {r['invoke'] / r['litert']:7.2f} "
                f"{r['floor'] / r['litert']:8.2f} {r['run']:6.1f} {r['litert_run']:6.1f} "
                f"{r['run'] / r['litert_run']:6.2f}  {kinds}",
                flush=True,
            )
    _print_fused(rows, cheapest)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


def _print_fused(rows: list[tuple[str, dict]], cheapest: float) -> None:
    """The fused design's floor (fused_calls) and its per-call arithmetic: per kind of
    call, calls per invoke x measured ns per call; bound: all its calls at the cheapest
    call measured, against LiteRT (what no design with that many calls can beat)."""
    print()
    print(
        "fused: the fused design's bare calls (see fused_calls); bound: calls x the "
        f"cheapest call ({cheapest * 1e3:.0f} ns) / LiteRT; per kind: calls x ns per call"
    )
    header = (
        f"{'model':18} {'calls':>5} {'fused':>6} {'LiteRT':>6} {'fused/LR':>8} "
        f"{'bound':>6}  per kind"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows:
        n = sum(r["fused_calls"].values())
        kinds = ", ".join(
            f"{k} {c}x{r[f'fused {k}'] / c * 1e3:.0f}" for k, c in r["fused_calls"].items() if c
        )
        print(
            f"{name:18} {n:5d} {r['fused']:6.1f} {r['litert']:6.1f} "
            f"{r['fused'] / r['litert']:8.2f} {n * cheapest / r['litert']:6.2f}  {kinds}",
            flush=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
