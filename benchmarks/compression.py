"""Compression benchmark: sporenet's quantized models beside onnxruntime's, in one run.

Networks: the digits CNN and MLP trained by sporenet.cloud (accuracy on the digits test
split) and the untrained MobileNetV2-style and ResNet-18-style nets of
benchmarks/lite_inference.py (output SQNR against float). For each: file sizes (float,
static int8, dynamic int8, fp16 .spore; float and quantize_static QDQ .onnx), accuracy or
SQNR, and latency plus peak memory of float and int8 in sporenet and in onnxruntime
(onnxruntime's quantize_static, QDQ, the same calibration samples, MinMax, per-channel).
Latency and memory are measured in a fresh subprocess per model (load, first call, then
the median of single calls at batch 1 on one thread) with OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unset; each prints the BLAS kernel it ran (threadpoolctl). The issue's
targets are printed with PASS/FAIL at the end; pruning and QAT come from
sporenet.cloud.compression and print "not available" where it is missing.

    python benchmarks/compression.py            # full run (a few minutes)
    python benchmarks/compression.py --quick    # fewer epochs, calls and nets

Needs the `test` extra (onnx, onnxruntime) and the `datasets` extra (scikit-learn).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import cpu_description, sqnr_db

HERE = Path(__file__).resolve().parent
CALIBRATION_SAMPLES = 100
UNSET_FOR_TIMING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


# --------------------------------------------------------------------------- networks


@dataclass
class Net:
    """One network in both formats, with its calibration and evaluation data."""

    name: str
    spore: bytes
    onnx: bytes
    calibration: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray | None = None  # labels: accuracy; None: SQNR against float
    input_name: str = "x"
    output_name: str = "y"
    results: dict[str, dict] = field(default_factory=dict)
    module: Any = None  # the trained sporenet.cloud model (digits nets)


def spore_to_onnx(data: bytes, input_name: str, output_name: str) -> bytes:
    """The ONNX graph of a float .spore inference model made of the ops cloud.export
    writes for the digits nets (Mul, Conv2D, ReLU, MaxPool, Flatten, FullyConnected)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from sporenet.lite import OpCode, parse

    model = parse(data)
    graph = model.graphs[0]
    names = {i: t.name for i, t in enumerate(model.tensors)}
    inits = [
        numpy_helper.from_array(np.asarray(t.data), t.name)
        for t in model.tensors
        if t.data is not None
    ]
    nodes = []
    for node in graph.nodes:
        ins = [names[i] for i in node.inputs if i != -1]
        out = names[node.outputs[0]]
        act = node.attrs.get("activation", "none")
        target = f"{out}/pre" if act != "none" else out
        if node.op == OpCode.MUL:
            nodes.append(helper.make_node("Mul", ins, [target]))
        elif node.op == OpCode.CONV2D:
            nodes.append(
                helper.make_node(
                    "Conv",
                    ins,
                    [target],
                    strides=node.attrs.get("strides", [1, 1]),
                    pads=node.attrs.get("pads", [0, 0, 0, 0]),
                    dilations=node.attrs.get("dilations", [1, 1]),
                    group=node.attrs.get("group", 1),
                )
            )
        elif node.op == OpCode.RELU:
            nodes.append(helper.make_node("Relu", ins, [target]))
        elif node.op == OpCode.MAX_POOL2D:
            nodes.append(
                helper.make_node(
                    "MaxPool",
                    ins,
                    [target],
                    kernel_shape=node.attrs["kernel_shape"],
                    strides=node.attrs.get("strides", [1, 1]),
                    pads=node.attrs.get("pads", [0, 0, 0, 0]),
                )
            )
        elif node.op == OpCode.FLATTEN:
            nodes.append(helper.make_node("Flatten", ins, [target], axis=node.attrs.get("axis", 1)))
        elif node.op == OpCode.FULLY_CONNECTED:
            nodes.append(helper.make_node("Gemm", ins, [target], transB=1))
        else:
            raise ValueError(f"spore_to_onnx: no ONNX form for {node.op.name}")
        if act == "relu":
            nodes.append(helper.make_node("Relu", [target], [out]))
        elif act != "none":
            raise ValueError(f"spore_to_onnx: fused activation {act!r}")
    x = model.tensors[graph.inputs[0]]
    y = model.tensors[graph.outputs[0]]
    onnx_graph = helper.make_graph(
        nodes,
        "digits",
        [
            helper.make_tensor_value_info(
                x.name, TensorProto.FLOAT, ["N" if d == -1 else d for d in x.shape]
            )
        ],
        [
            helper.make_tensor_value_info(
                y.name, TensorProto.FLOAT, ["N" if d == -1 else d for d in y.shape]
            )
        ],
        initializer=inits,
    )
    proto = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto.SerializeToString()


def digits_nets(epochs_cnn: int, epochs_mlp: int) -> list[Net]:
    from sporenet import cloud
    from sporenet.cloud.export import to_inference_ir
    from sporenet.cloud.models import digits_cnn, digits_mlp
    from sporenet.lite import serialize

    data = cloud.load_digits()
    nets = []
    for name, build, epochs in (
        ("digits-cnn", digits_cnn, epochs_cnn),
        ("digits-mlp", digits_mlp, epochs_mlp),
    ):
        cloud.manual_seed(0)
        model = build()
        cloud.fit(
            model,
            data.x_train,
            data.y_train,
            epochs=epochs,
            batch_size=32,
            optimizer=cloud.Adam(lr=3e-3),
            verbose=0,
            seed=0,
        )
        ir = to_inference_ir(model, probabilities=False)
        spore = serialize(ir)
        sig = ir.signature("infer")
        x_name, y_name = next(iter(sig.inputs)), next(iter(sig.outputs))
        nets.append(
            Net(
                name,
                spore,
                spore_to_onnx(spore, x_name, y_name),
                data.x_train[:CALIBRATION_SAMPLES],
                data.x_test,
                data.y_test,
                x_name,
                y_name,
                module=model,
            )
        )
    return nets


def twin_nets(names: list[str]) -> list[Net]:
    if not names:
        return []
    spec = importlib.util.spec_from_file_location("lite_inference", HERE / "lite_inference.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["lite_inference"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    nets = []
    rng = np.random.default_rng(0)
    for name in names:
        twin = getattr(module, name)()
        spore, onnx_bytes = twin.finish(twin.y)
        shape = twin.input_shape
        calib = rng.normal(size=(CALIBRATION_SAMPLES // 4, *shape[1:])).astype(np.float32)
        test = rng.normal(size=(8, *shape[1:])).astype(np.float32)
        nets.append(Net(name, spore, _fix_batch(onnx_bytes), calib, test))
    return nets


def _fix_batch(onnx_bytes: bytes) -> bytes:
    """The twin nets declare batch 1; make it dynamic so one session runs any batch."""
    import onnx

    proto = onnx.load_from_string(onnx_bytes)
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return proto.SerializeToString()


# ------------------------------------------------------------------------- quantizing


def ort_quantize_static(
    onnx_bytes: bytes, calibration: np.ndarray, input_name: str, workdir: Path
) -> bytes:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{input_name: calibration[i : i + 1]} for i in range(len(calibration))])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    src, dst = workdir / "float.onnx", workdir / "qdq.onnx"
    src.write_bytes(onnx_bytes)
    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
        calibrate_method=CalibrationMethod.MinMax,
    )
    return dst.read_bytes()


def run_sporenet(
    data: bytes, x: np.ndarray, input_name: str, output_name: str | None = None
) -> np.ndarray:
    """The model's output (`output_name`, or its only one) on x, batch by batch when the
    model's batch size is fixed."""
    from sporenet.lite import Interpreter

    interpreter = Interpreter(model_content=data)
    batch = interpreter.get_input_details()[0]["shape_signature"][0]

    def run(chunk: np.ndarray) -> np.ndarray:
        outputs = interpreter.run({input_name: chunk})
        return outputs[output_name] if output_name else next(iter(outputs.values()))

    if batch in (-1, len(x)):
        return run(x)
    return np.concatenate([run(x[i : i + batch]) for i in range(0, len(x), batch)])


def run_ort(data: bytes, x: np.ndarray, input_name: str) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, {input_name: x})[0]


# ---------------------------------------------------------------- timing subprocesses


WORKER = r"""
import json, os, statistics, sys, time
runtime, path, x_path, input_name, runs = sys.argv[1:6]
import numpy as np
x = np.load(x_path)

def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0

if runtime == "ort":
    import onnxruntime as ort
else:
    from sporenet.lite import Interpreter
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak: count only what loading and running take
except OSError:
    pass
base = rss("VmRSS:")
if runtime == "ort":
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    call = lambda: session.run(None, {input_name: x})
else:
    interpreter = Interpreter(model_path=path, num_threads=1)
    call = lambda: interpreter.run({input_name: x})
call()
peak = rss("VmHWM:") - base
times = []
for _ in range(int(runs)):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
try:
    from threadpoolctl import threadpool_info
    blas = ", ".join(sorted({f"{i.get('internal_api')} {i.get('architecture')}"
                             for i in threadpool_info() if i.get("user_api") == "blas"}))
except ImportError:
    blas = "unknown (threadpoolctl missing)"
print(json.dumps({"median": statistics.median(times), "peak": peak, "blas": blas}))
"""


def measure(
    runtime: str, data: bytes, x: np.ndarray, input_name: str, runs: int, workdir: Path
) -> dict:
    """Latency (median of `runs` single calls) and peak memory of load + first call, in a
    fresh interpreter process."""
    suffix = ".onnx" if runtime == "ort" else ".spore"
    path = workdir / f"model{suffix}"
    path.write_bytes(data)
    x_path = workdir / "x.npy"
    np.save(x_path, x)
    env = {k: v for k, v in os.environ.items() if k not in UNSET_FOR_TIMING}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, runtime, str(path), str(x_path), input_name, str(runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def evaluate(net: Net, runs: int, workdir: Path) -> None:
    from sporenet.converter.quantize import quantize_model

    calib = {net.input_name: net.calibration}
    start = time.perf_counter()
    static = quantize_model(net.spore, mode="int8", calibration=calib)
    seconds = time.perf_counter() - start
    dynamic = quantize_model(net.spore, mode="dynamic", report=False).data
    fp16 = quantize_model(net.spore, mode="fp16", report=False).data
    qdq = ort_quantize_static(net.onnx, net.calibration, net.input_name, workdir)
    models = {
        "sporenet float": net.spore,
        "sporenet int8": static.data,
        "sporenet dynamic": dynamic,
        "sporenet fp16": fp16,
        "onnxruntime float": net.onnx,
        "onnxruntime int8 (QDQ)": qdq,
    }
    reference = run_sporenet(net.spore, net.x_test, net.input_name, net.output_name)
    for label, data in models.items():
        entry: dict = {"bytes": len(data)}
        try:
            if label.startswith("sporenet"):
                out = run_sporenet(data, net.x_test, net.input_name, net.output_name)
            else:
                out = run_ort(data, net.x_test, net.input_name)
            if net.y_test is not None:
                entry["accuracy"] = float(np.mean(out.argmax(axis=1) == net.y_test))
            entry["sqnr"] = sqnr_db(reference, out)
        except Exception as exc:  # a mode the runtime cannot run yet: reported, not fatal
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        net.results[label] = entry
    net.results["sporenet int8"]["quantize_seconds"] = seconds
    net.results["sporenet int8"]["float_ops"] = len(static.report.float_ops)
    net.results["sporenet int8"]["worst"] = [
        f"{t.name} {t.sqnr_db:.1f} dB" for t in static.report.worst(3)
    ]
    # sporenet running onnxruntime's own QDQ model: within one output step of onnxruntime?
    try:
        from sporenet.converter import convert_onnx

        mine = run_sporenet(convert_onnx(qdq), net.x_test, net.input_name)
        theirs = run_ort(qdq, net.x_test, net.input_name)
        step = _qdq_output_step(qdq)
        # onnxruntime against its own QDQ reference (no graph optimizations: the Q/DQ ops
        # run as written): how far its int8 kernels drift on this net.
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        reference = ort.InferenceSession(qdq, options, providers=["CPUExecutionProvider"]).run(
            None, {net.input_name: net.x_test}
        )[0]
        net.results["qdq import"] = {
            "within_one_step": float(np.mean(np.abs(mine - reference) <= step * 1.0001)),
            "of_optimized": float(np.mean(np.abs(mine - theirs) <= step * 1.0001)),
            "ort_self": float(np.mean(np.abs(reference - theirs) <= step * 1.0001)),
            "step": step,
        }
    except Exception as exc:
        net.results["qdq import"] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    one = net.x_test[:1]
    for label in ("sporenet float", "sporenet int8", "onnxruntime float", "onnxruntime int8 (QDQ)"):
        if "error" in net.results[label]:
            continue
        runtime = "ort" if label.startswith("onnxruntime") else "sporenet"
        net.results[label].update(
            measure(runtime, models[label], one, net.input_name, runs, workdir)
        )


def _qdq_output_step(data: bytes) -> float:
    import onnx
    from onnx import numpy_helper

    proto = onnx.load_from_string(data)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    output = proto.graph.output[0].name
    producer = next(n for n in proto.graph.node if output in n.output)
    if producer.op_type == "DequantizeLinear":
        return float(inits[producer.input[1]].reshape(-1)[0])
    return float("nan")


def print_net(net: Net) -> None:
    print(f"\n== {net.name}")
    print(
        f"  {'model':<26}{'bytes':>10}{'ratio':>7}{'accuracy':>10}{'SQNR dB':>9}"
        f"{'latency':>11}{'peak MB':>9}"
    )
    base = net.results["sporenet float"]["bytes"]
    for label, r in net.results.items():
        if label == "qdq import":
            continue
        acc = f"{100 * r['accuracy']:.2f}%" if "accuracy" in r else "-"
        sq = (
            f"{r['sqnr']:.1f}"
            if "sqnr" in r and np.isfinite(r["sqnr"])
            else ("exact" if "sqnr" in r else "-")
        )
        lat = f"{r['median'] * 1e3:.3f} ms" if "median" in r else "-"
        peak = f"{r['peak'] / 2**20:.1f}" if "peak" in r else "-"
        print(
            f"  {label:<26}{r['bytes']:>10,}{r['bytes'] / base:>7.2f}{acc:>10}{sq:>9}"
            f"{lat:>11}{peak:>9}"
        )
        if "error" in r:
            print(f"      error: {r['error']}")
    info = net.results["sporenet int8"]
    if "worst" in info:
        print(
            f"  int8: {info['float_ops']} op(s) kept float; worst tensors: "
            + "; ".join(info["worst"])
            + f"; quantized in {info['quantize_seconds']:.1f} s"
        )
    blas = {r.get("blas") for r in net.results.values() if r.get("blas")}
    if blas:
        print(f"  BLAS: {', '.join(sorted(blas))}")


def targets(nets: list[Net]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, PASS/FAIL or None for not available)."""
    rows: list[tuple[str, str, bool | None]] = []
    by = {n.name: n for n in nets}
    cnn = by.get("digits-cnn")
    if cnn is not None:
        f, q = cnn.results["sporenet float"], cnn.results["sporenet int8"]
        if "accuracy" in q:
            drop = 100 * (f["accuracy"] - q["accuracy"])
            rows.append(
                (
                    "digits CNN static int8 (100 calibration samples): accuracy within "
                    "0.5 points of float",
                    f"float {100 * f['accuracy']:.2f}%, int8 {100 * q['accuracy']:.2f}% "
                    f"({-drop:+.2f})",
                    drop <= 0.5,
                )
            )
        ratio = q["bytes"] / f["bytes"]
        rows.append(("digits CNN static int8: file <= 0.3x float", f"{ratio:.2f}x", ratio <= 0.3))
    for net in nets:
        if net.y_test is None:
            continue
        q, o = net.results["sporenet int8"], net.results["onnxruntime int8 (QDQ)"]
        if "accuracy" in q and "accuracy" in o:
            rows.append(
                (
                    f"{net.name}: sporenet static PTQ accuracy >= onnxruntime quantize_static's",
                    f"{100 * q['accuracy']:.2f}% vs {100 * o['accuracy']:.2f}%",
                    q["accuracy"] >= o["accuracy"],
                )
            )
    for net in nets:
        r = net.results.get("qdq import", {})
        if "within_one_step" in r:
            rows.append(
                (
                    f"{net.name}: onnxruntime's QDQ model in sporenet within one step of "
                    "the model's reference run (onnxruntime, no graph optimizations) on "
                    ">= 99.9% of elements",
                    f"{100 * r['within_one_step']:.2f}% (of onnxruntime's optimized int8 "
                    f"kernels, which depend on the CPU: {100 * r['of_optimized']:.2f}%; those "
                    f"against the reference: {100 * r['ort_self']:.2f}%)",
                    r["within_one_step"] >= 0.999,
                )
            )
        else:
            rows.append((f"{net.name}: QDQ model in sporenet", r.get("error", "?"), False))
    for net in nets:
        f, q = net.results["sporenet float"], net.results["sporenet int8"]
        if "median" in f and "median" in q:
            ratio = q["median"] / f["median"]
            rows.append(
                (
                    f"{net.name}: int8 latency <= 1.3x sporenet float32",
                    f"{ratio:.2f}x",
                    ratio <= 1.3,
                )
            )
            peak = q["peak"] / max(f["peak"], 1)
            rows.append(
                (
                    f"{net.name}: int8 peak memory (load + first call) <= 0.5x float",
                    f"{q['peak'] / 2**20:.1f} / {f['peak'] / 2**20:.1f} MB = {peak:.2f}x",
                    peak <= 0.5,
                )
            )
    return rows


def compression_targets(
    nets: list[Net], runs: int, workdir: Path, quick: bool
) -> list[tuple[str, str, bool | None]]:
    """Pruning, QAT and structured pruning through sporenet.cloud.compression's public API:
    the digits CNN pruned to 80% sparsity with fine-tuning (sparse file, and int8 on top),
    quantization-aware training from the float CNN, half the channels of the
    ResNet-18-style net removed (latency in fresh subprocesses)."""
    names = (
        "digits CNN QAT: accuracy within 0.2 points of float",
        "80% unstructured sparsity + fine-tuning: accuracy within 1 point of float",
        "80% sparse: file <= 0.35x float",
        "80% sparse + int8: file <= 0.15x float",
        "structured pruning of half the ResNet-18-style channels: latency <= 0.6x",
    )
    if importlib.util.find_spec("sporenet.cloud.compression") is None:
        return [
            (n, "not available: sporenet.cloud.compression is not in this tree", None)
            for n in names
        ]
    from sporenet import cloud
    from sporenet.cloud import compression as C
    from sporenet.lite import parse, serialize

    by = {n.name: n for n in nets}
    rows: list[tuple[str, str, bool | None]] = []
    cnn = by.get("digits-cnn")
    if cnn is None or cnn.module is None:
        rows += [(n, "not measured: digits-cnn not in --nets", None) for n in names[:4]]
    else:
        data = cloud.load_digits()
        calibration = data.x_train[:200]
        base_acc = cnn.results["sporenet float"]["accuracy"]
        base_bytes = len(cnn.spore)

        def accuracy(model_bytes: bytes) -> float:
            out = run_sporenet(model_bytes, data.x_test, cnn.input_name)
            return float(np.mean(out.argmax(axis=1) == data.y_test))

        qat = C.prepare_qat(cnn.module, calibration)
        cloud.fit(
            qat,
            data.x_train,
            data.y_train,
            epochs=1 if quick else 3,
            batch_size=32,
            optimizer=cloud.Adam(lr=1e-4),
            verbose=0,
            seed=2,
        )
        qat_bytes = C.export_int8(qat, calibration).data
        acc = accuracy(qat_bytes)
        rows.append(
            (
                names[0],
                f"float {100 * base_acc:.2f}%, QAT int8 {100 * acc:.2f}% "
                f"({100 * (acc - base_acc):+.2f}), file {len(qat_bytes) / base_bytes:.2f}x",
                base_acc - acc <= 0.002,
            )
        )

        import copy

        pruned = copy.deepcopy(cnn.module)
        epochs = 4 if quick else 12
        steps = epochs * ((len(data.x_train) + 31) // 32)
        pruning = C.Pruning(
            C.PolynomialSparsity(0.8, begin_step=0, end_step=2 * steps // 3), frequency=10
        )
        cloud.fit(
            pruned,
            data.x_train,
            data.y_train,
            epochs=epochs,
            batch_size=32,
            optimizer=cloud.Adam(lr=1e-3),
            callbacks=[pruning],
            verbose=0,
            seed=1,
        )
        sparsity = C.sparsity_of(C.prunable_weights(pruned).values())
        sparse_path = workdir / "pruned.spore"
        C.export_sparse(pruned, sparse_path, probabilities=False)
        sparse_bytes = sparse_path.read_bytes()
        sparse_int8 = C.sparse_int8(pruned, calibration[:CALIBRATION_SAMPLES])
        acc = accuracy(sparse_bytes)
        rows.append(
            (
                names[1],
                f"{sparsity:.0%} sparse: {100 * acc:.2f}% vs float {100 * base_acc:.2f}%",
                base_acc - acc <= 0.01,
            )
        )
        ratio = len(sparse_bytes) / base_bytes
        rows.append((names[2], f"{len(sparse_bytes):,} bytes = {ratio:.2f}x", ratio <= 0.35))
        ratio = len(sparse_int8) / base_bytes
        rows.append(
            (
                names[3],
                f"{len(sparse_int8):,} bytes = {ratio:.2f}x, accuracy "
                f"{100 * accuracy(sparse_int8):.2f}%",
                ratio <= 0.15,
            )
        )
    resnet = by.get("resnet18")
    if resnet is None:
        rows.append((names[4], "not measured: resnet18 not in --nets", None))
    else:
        smaller = serialize(C.prune_channels(parse(resnet.spore), 0.5))
        one = resnet.x_test[:1]
        full = measure("sporenet", resnet.spore, one, resnet.input_name, runs, workdir)
        half = measure("sporenet", smaller, one, resnet.input_name, runs, workdir)
        if "median" in full and "median" in half:
            ratio = half["median"] / full["median"]
            rows.append(
                (
                    names[4],
                    f"{full['median'] * 1e3:.2f} -> {half['median'] * 1e3:.2f} "
                    f"ms = {ratio:.2f}x (file {len(smaller) / len(resnet.spore):.2f}x)",
                    ratio <= 0.6,
                )
            )
        else:
            rows.append((names[4], f"failed: {full.get('error') or half.get('error')}", False))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer epochs, calls and nets")
    parser.add_argument("--nets", default="digits-cnn,digits-mlp,mobilenetv2,resnet18")
    args = parser.parse_args(argv)
    wanted = args.nets.split(",")
    if args.quick:
        wanted = [w for w in wanted if w != "resnet18"]
    runs = 20 if args.quick else 100
    print(
        f"sporenet compression benchmark: python {sys.version.split()[0]}, numpy "
        f"{np.__version__}, {os.cpu_count()} CPUs; timing subprocesses without "
        f"{' and '.join(UNSET_FOR_TIMING)}; batch 1, one thread, median of {runs} calls"
    )
    print(f"CPU: {cpu_description()} (each net prints the BLAS kernel its children ran)")
    nets: list[Net] = []
    if {"digits-cnn", "digits-mlp"} & set(wanted):
        nets += [
            n
            for n in digits_nets(4 if args.quick else 8, 40 if args.quick else 100)
            if n.name in wanted
        ]
    nets += twin_nets([w for w in wanted if w in ("mobilenetv2", "resnet18")])
    with tempfile.TemporaryDirectory() as tmp:
        for net in nets:
            evaluate(net, runs, Path(tmp))
            print_net(net)
        rows = targets(nets)
        rows += compression_targets(nets, runs, Path(tmp), args.quick)
    print("\n== targets")
    for target, measured, ok in rows:
        verdict = "n/a " if ok is None else ("PASS" if ok else "FAIL")
        print(f"  [{verdict}] {target}: {measured}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
