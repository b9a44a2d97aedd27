"""int8 inference in sporenet.lite against its own float32 path (and onnxruntime's QLinear
kernels): per-layer medians, whole-network latency, and peak memory of load + first call.

The networks are those of benchmarks/lite_inference.py (MobileNetV2-style at 96x96,
ResNet-18-style at 112x112, LeNet-style, MLP) and the digits CNN of
sporenet.cloud.models.digits_cnn (BatchNorm folded, random weights). Each is emitted twice:
as the float model lite_inference builds, and as an int8 model of the same structure
(per-channel symmetric int8 weights, int32 biases, asymmetric int8 activations whose
ranges come from one float run on the benchmark input: a plain min/max calibration, so
the output SQNR printed is a sanity check, not the quantizer's quality).

    python benchmarks/int8_kernels.py            # layers + nets + memory (about a minute)
    python benchmarks/int8_kernels.py --quick    # fewer repeats
    python benchmarks/int8_kernels.py --part nets --nets resnet18

Targets (issue 15): int8 latency <= 1.3x float32 in sporenet; peak memory of the int8
model (load from bytes + first call, traced by tracemalloc in a fresh subprocess) <= 0.5x
the float model's. One thread.
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
from collections.abc import Callable
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lite_inference as li  # noqa: E402  (chooses the OpenBLAS core before NumPy loads)
import numpy as np  # noqa: E402
from _common import cpu_description, sqnr_db  # noqa: E402

from sporenet.lite import Interpreter, ModelBuilder, OpCode, parse, serialize  # noqa: E402
from sporenet.lite.graph import Quantization  # noqa: E402

INT8_LATENCY_TARGET = 1.3
MEMORY_TARGET = 0.5


# --------------------------------------------------------------------- int8 networks


def _qparams(lo: float, hi: float) -> tuple[float, int]:
    """Asymmetric int8 (scale, zero point) covering [lo, hi] and 0."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-8) / 255
    zp = int(np.clip(round(-128 - lo / scale), -128, 127))
    return scale, zp


def _quant(scale, zp=0) -> Quantization:
    s = np.atleast_1d(np.asarray(scale, np.float32))
    return Quantization(
        scale=s, zero_point=np.broadcast_to(np.asarray(zp, np.int64), s.shape).copy()
    )


class Recorder(li.Twin):
    """lite_inference's Twin that also records every op, so the same network can be
    replayed as an int8 model once activation ranges are known."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ops: list[tuple] = []
        self.weights: dict[int, np.ndarray] = {}

    def _const(self, prefix: str, value: np.ndarray) -> tuple[int, str]:
        index, name = super()._const(prefix, value)
        self.weights[index] = value
        return index, name

    def conv(self, x, out_ch, k, stride=1, group=1, act="none"):
        y = super().conv(x, out_ch, k, stride, group, act)
        node = self.b.nodes[-1]
        self.ops.append(("conv", x[0], y[0], node.inputs[1], node.inputs[2], dict(node.attrs)))
        return y

    def add(self, a, b, act="none"):
        y = super().add(a, b, act)
        self.ops.append(("add", (a[0], b[0]), y[0], act))
        return y

    def max_pool(self, x, k, stride, pad):
        y = super().max_pool(x, k, stride, pad)
        self.ops.append(("max_pool", x[0], y[0], dict(self.b.nodes[-1].attrs)))
        return y

    def global_avg_pool_flatten(self, x):
        y = super().global_avg_pool_flatten(x)
        self.ops.append(("gap_flatten", x[0], y[0], self.b.nodes[-2].outputs[0]))
        return y

    def flatten(self, x, features):
        y = super().flatten(x, features)
        self.ops.append(("flatten", x[0], y[0]))
        return y

    def dense(self, x, out_f, act="none"):
        y = super().dense(x, out_f, act)
        node = self.b.nodes[-1]
        self.ops.append(("dense", x[0], y[0], node.inputs[1], node.inputs[2], dict(node.attrs)))
        return y


def _ranges(float_bytes: bytes, x: np.ndarray) -> dict[int, tuple[float, float]]:
    """min/max of every tensor of the float model on input x (one calibration run)."""
    model = parse(float_bytes)
    graph, sig = model.graphs[0], model.signatures["infer"]
    for node in graph.nodes:
        for i in node.outputs:
            if i not in graph.outputs:
                graph.outputs.append(i)
                sig.outputs[f"t{i}"] = i
    outs = Interpreter(model=model).run({"x": x})
    ranges = {i: (float(outs[n].min()), float(outs[n].max())) for n, i in sig.outputs.items()}
    ranges[graph.inputs[0]] = (float(x.min()), float(x.max()))
    return ranges


def _sym_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.abs(w).reshape(len(w), -1).max(axis=1) / 127
    scale = np.maximum(scale, 1e-12).astype(np.float32)
    q = np.round(w / scale.reshape(-1, *[1] * (w.ndim - 1))).astype(np.int8)
    return q, scale


def int8_model(rec: Recorder, float_bytes: bytes, x: np.ndarray) -> bytes:
    """The recorded network as an int8 model: QUANTIZE in, int8 ops, DEQUANTIZE out."""
    ranges = _ranges(float_bytes, x)
    b = ModelBuilder(producer="benchmark-int8")
    params: dict[int, tuple[float, int]] = {}
    where: dict[int, int] = {}

    def out(index_float: int, index_q: int, same_as: int | None = None) -> int:
        p = params[same_as] if same_as is not None else _qparams(*ranges[index_float])
        params[index_float] = p
        where[index_float] = index_q
        return b.quantize(index_q, p[0], p[1], dtype=np.int8)

    xin = b.input("x", x.shape)
    x0 = rec.x[0]
    out(x0, b.op(OpCode.QUANTIZE, [xin]))
    for op in rec.ops:
        kind = op[0]
        if kind in ("conv", "dense"):
            _, src, dst, wi, bi, attrs = op
            qw, sw = _sym_weights(rec.weights[wi])
            sx = params[src][0]
            bias = np.round(rec.weights[bi] / (sx * sw)).astype(np.int32)
            w_t = b.constant(f"w{dst}", qw, quantization=_quant(sw))
            b_t = b.constant(f"b{dst}", bias)
            code = OpCode.CONV2D if kind == "conv" else OpCode.FULLY_CONNECTED
            out(dst, b.op(code, [where[src], w_t, b_t], **attrs))
        elif kind == "add":
            _, (a, c), dst, act = op
            out(dst, b.op(OpCode.ADD, [where[a], where[c]], activation=act))
        elif kind == "max_pool":
            _, src, dst, attrs = op
            out(dst, b.op(OpCode.MAX_POOL2D, [where[src]], **attrs), same_as=src)
        elif kind == "gap_flatten":
            _, src, dst, pooled = op
            g = b.op(OpCode.GLOBAL_AVG_POOL, [where[src]])
            out(pooled, g)
            out(dst, b.op(OpCode.FLATTEN, [g]), same_as=pooled)
        elif kind == "flatten":
            _, src, dst = op
            out(dst, b.op(OpCode.FLATTEN, [where[src]]), same_as=src)
    b.output(b.op(OpCode.DEQUANTIZE, [where[rec.y[0]]]), name="y")
    return serialize(b.build())


def digits() -> li.Twin:
    """sporenet.cloud.models.digits_cnn's inference graph (BatchNorm folded into the
    convolutions): three 3x3 conv + ReLU blocks at 8x8, 8x8, 4x4 with 2x2 max-pools after
    the second and third, then one dense layer on 256 features."""
    t = li.Twin((1, 1, 8, 8))
    h = t.conv(t.x, 32, 3, act="relu")
    h = t.conv(h, 32, 3, act="relu")
    h = t.max_pool(h, 2, 2, 0)
    h = t.conv(h, 64, 3, act="relu")
    h = t.max_pool(h, 2, 2, 0)
    t.y = t.dense(t.flatten(h, 256), 10)
    return t


NETS: dict[str, Callable[[], li.Twin]] = {**li.NETS, "digits": digits}


def build_pair(name: str) -> tuple[bytes, bytes, np.ndarray]:
    """(float model bytes, int8 model bytes, input) for one of lite_inference's nets."""
    original = li.Twin
    li.Twin = Recorder  # the net functions build whatever `Twin` names
    try:
        rec = NETS[name]()
    finally:
        li.Twin = original
    float_bytes, _ = rec.finish(rec.y)
    x = np.random.default_rng(1).normal(size=rec.input_shape).astype(np.float32)
    return float_bytes, int8_model(rec, float_bytes, x), x


# --------------------------------------------------------------------- measurements


def median_time(fn: Callable[[], object], budget: float, min_runs: int) -> float:
    for _ in range(3):
        fn()
    times, deadline = [], time.perf_counter() + budget
    while len(times) < min_runs or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired_medians(fns: list[Callable[[], object]], budget: float, min_runs: int) -> list[float]:
    times = li.paired_timings(fns, budget, min_runs)
    return [statistics.median(t) for t in times]


def paired_stats(
    fns: list[Callable[[], object]], budget: float, min_runs: int
) -> tuple[list[float], list[float]]:
    """Medians and minima (best-of: less sensitive to a shared machine) of each function."""
    times = li.paired_timings(fns, budget, min_runs)
    return [statistics.median(t) for t in times], [min(t) for t in times]


def memory_in_subprocess(path: Path, shape: tuple[int, ...]) -> dict[str, float]:
    """Peak traced bytes and RSS growth of reading a model file, planning it and running
    it once, in a fresh interpreter (so nothing else is counted)."""
    code = f"""
import json, resource, tracemalloc
import numpy as np
from sporenet.lite import Interpreter
x = np.zeros({shape!r}, np.float32)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
data = open({str(path)!r}, "rb").read()
it = Interpreter(model_content=data, num_threads=1)
it.run({{"x": x}})
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"traced_peak": peak, "rss_growth": (rss1 - rss0) * 1024}}))
"""
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    env["OPENBLAS_NUM_THREADS"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def layer_cases() -> list[tuple[str, tuple[int, ...], int, int, int, int]]:
    """(label, input shape, out channels, kernel, stride, group) of typical layers."""
    return [
        ("mbv2 pointwise 48->8 24x24", (1, 48, 24, 24), 8, 1, 1, 1),
        ("mbv2 pointwise 8->48 24x24", (1, 8, 24, 24), 48, 1, 1, 1),
        ("mbv2 depthwise 96 24x24 s2", (1, 96, 24, 24), 96, 3, 2, 96),
        ("mbv2 depthwise 192 6x6", (1, 192, 6, 6), 192, 3, 1, 192),
        ("resnet 3x3 64 28x28", (1, 64, 28, 28), 64, 3, 1, 1),
        ("resnet 3x3 256 7x7", (1, 256, 7, 7), 256, 3, 1, 1),
        ("resnet 3x3 512 4x4", (1, 512, 4, 4), 512, 3, 1, 1),
        ("resnet stem 7x7 s2", (1, 3, 112, 112), 64, 7, 2, 1),
    ]


def conv_models(shape, o, k, stride, group) -> tuple[bytes, bytes, bytes, np.ndarray]:
    """One conv layer as a float model, an int8 model and an ONNX QLinearConv model."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = shape[1]
    w = rng.normal(size=(o, c // group, k, k)).astype(np.float32) * 0.1
    bias = rng.normal(size=o).astype(np.float32) * 0.1
    attrs = dict(strides=[stride, stride], pads=[k // 2] * 4, group=group)
    fb = ModelBuilder()
    fx = fb.input("x", shape)
    fb.output(
        fb.op(
            OpCode.CONV2D,
            [fx, fb.constant("w", w), fb.constant("b", bias)],
            activation="relu",
            **attrs,
        ),
        "y",
    )
    qw, sw = _sym_weights(w)
    sx, zx, so, zo = 0.03, -10, 0.05, -128
    qb = ModelBuilder()
    qx = qb.input("x", shape, np.int8)
    qb.quantize(qx, sx, zx)
    qbias = np.round(bias / (sx * sw)).astype(np.int32)
    y = qb.op(
        OpCode.CONV2D,
        [qx, qb.constant("w", qw, quantization=_quant(sw)), qb.constant("b", qbias)],
        activation="relu",
        **attrs,
    )
    qb.output(qb.quantize(y, so, zo, dtype=np.int8), "y")
    inits = [
        numpy_helper.from_array(v, n)
        for n, v in [
            ("sx", np.float32(sx)),
            ("zx", np.int8(zx)),
            ("w", qw),
            ("sw", sw),
            ("zw", np.zeros(o, np.int8)),
            ("so", np.float32(so)),
            ("zo", np.int8(zo)),
            ("b", qbias),
        ]
    ]
    node = helper.make_node(
        "QLinearConv",
        ["x", "sx", "zx", "w", "sw", "zw", "so", "zo", "b"],
        ["y"],
        kernel_shape=[k, k],
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "qconv",
        [helper.make_tensor_value_info("x", TensorProto.INT8, shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 10)
    xq = rng.integers(-128, 128, shape).astype(np.int8)
    return (serialize(fb.build()), serialize(qb.build()), model.SerializeToString(), xq)


def run_layers(budget: float, min_runs: int) -> None:
    import onnxruntime as ort

    print(f"\n{'layer':<30} {'float32':>11} {'int8':>11} {'int8/f32':>8} {'ORT QLinear':>12}")
    for label, shape, o, k, stride, group in layer_cases():
        fbytes, qbytes, obytes, xq = conv_models(shape, o, k, stride, group)
        fi, qi = (
            Interpreter(model_content=fbytes, num_threads=1),
            Interpreter(model_content=qbytes, num_threads=1),
        )
        xf = xq.astype(np.float32) * 0.03
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        sess = ort.InferenceSession(obytes, options, providers=["CPUExecutionProvider"])
        tf, tq, to = paired_medians(
            [
                partial(fi.run, {"x": xf}),
                partial(qi.run, {"x": xq}),
                partial(sess.run, None, {"x": xq}),
            ],
            budget,
            min_runs,
        )
        print(
            f"{label:<30} {li._fmt(tf):>11} {li._fmt(tq):>11} {tq / tf:8.2f} {li._fmt(to):>12}",
            flush=True,
        )


def with_rounding(data: bytes, mode: str) -> bytes:
    """The model with the int8 kernels' `rounding` attribute set to `mode` on every node."""
    model = parse(data)
    for graph in model.graphs:
        for node in graph.nodes:
            node.attrs["rounding"] = mode
    return serialize(model)


def run_nets(names: list[str], budget: float, min_runs: int, memory: bool) -> list[str]:
    missed = []
    print(
        "\n'onnx/i8': the int8 model with rounding=\"onnx\" (onnxruntime's float\n"
        "requantization, as ONNX-imported models run) against the default TFLite rounding."
    )
    print(
        f"\n{'net':<12} {'float32':>11} {'int8':>11} {'ratio':>6} {'best-of':>7} {'onnx/i8':>7} "
        f"{'SQNR dB':>8} {'file f32':>10} {'file i8':>10} {'peak f32':>10} {'peak i8':>10} "
        f"{'ratio':>6}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            fbytes, qbytes, x = build_pair(name)
            fi = Interpreter(model_content=fbytes, num_threads=1)
            qi = Interpreter(model_content=qbytes, num_threads=1)
            oi = Interpreter(model_content=with_rounding(qbytes, "onnx"), num_threads=1)
            ref, got = fi.run({"x": x})["y"], qi.run({"x": x})["y"]
            (tf, tq, to), (bf, bq, _) = paired_stats(
                [partial(fi.run, {"x": x}), partial(qi.run, {"x": x}), partial(oi.run, {"x": x})],
                3 * budget,
                min_runs,
            )
            row = (
                f"{name:<12} {li._fmt(tf):>11} {li._fmt(tq):>11} {tq / tf:6.2f} {bq / bf:7.2f} "
                f"{to / tq:7.2f} {sqnr_db(ref, got):8.1f} {len(fbytes):>10,} {len(qbytes):>10,}"
            )
            if tq / tf > INT8_LATENCY_TARGET:
                missed.append(f"{name} latency")
            if memory:
                paths = []
                for kind, data in (("f32", fbytes), ("i8", qbytes)):
                    p = Path(tmp) / f"{name}.{kind}.spore"
                    p.write_bytes(data)
                    paths.append(p)
                mf = memory_in_subprocess(paths[0], x.shape)["traced_peak"]
                mq = memory_in_subprocess(paths[1], x.shape)["traced_peak"]
                row += f" {mf / 2**20:9.2f}M {mq / 2**20:9.2f}M {mq / mf:6.2f}"
                if mq / mf > MEMORY_TARGET:
                    missed.append(f"{name} memory")
            print(row, flush=True)
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", choices=["all", "layers", "nets"], default="all")
    parser.add_argument("--nets", default="mobilenetv2,resnet18,digits,lenet,mlp")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--blas-core", default="auto", help="see lite_inference.py")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(1)
    blas = [f"{i.get('internal_api')} {i.get('architecture')}" for i in threadpool_info()]
    print(f"CPU: {cpu_description()}")
    print(
        f"BLAS: {', '.join(blas)}   OpenBLAS core: {li._openblas_core()}   numpy "
        f"{np.__version__}   one thread"
    )
    budget, min_runs = (0.3, 5) if args.quick else (1.5, 15)
    if args.part in ("all", "layers"):
        run_layers(budget, min_runs)
    missed: list[str] = []
    if args.part in ("all", "nets"):
        missed = run_nets(args.nets.split(","), budget, min_runs, not args.no_memory)
    import resource

    print(
        f"\npeak RSS of this process: "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )
    if missed:
        print(f"missed targets: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
