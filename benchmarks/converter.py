"""Converter benchmark: conversion time and file size against the .onnx file, and batch-1
latency of converted light_squeezenet and light_resnet50 against onnxruntime (1 thread each).

    python benchmarks/converter.py [--runs 20] [--json results.json]

Sizes: the light_* models ship their weights as ConstantOfShape fills, so their .onnx files
are tiny; the size target is therefore also measured on "real-weight" copies of SqueezeNet
and ResNet-50 whose fills are replaced by random float32 initializers (what an exporter
writes). Latency runs the two engines alternately on the same input and reports medians.

BLAS kernels: OpenBLAS (NumPy's BLAS) picks its kernels from OPENBLAS_CORETYPE or, when
unset, by detecting the CPU; on AMD Zen it runs the AVX2 (Haswell) kernels even where the
CPU has AVX-512, while onnxruntime's MLAS uses AVX-512 itself. When /proc/cpuinfo lists
avx512f and OPENBLAS_CORETYPE is unset this script selects the SkylakeX (AVX-512) kernels;
`--openblas-coretype NAME` overrides whatever the environment says (the script re-executes
itself, since the choice must be made before NumPy loads).
"""

from __future__ import annotations

import os
import sys


def _avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def _coretype_override(argv: list[str]) -> str | None:
    for k, arg in enumerate(argv):
        if arg == "--openblas-coretype" and k + 1 < len(argv):
            return argv[k + 1]
        if arg.startswith("--openblas-coretype="):
            return arg.split("=", 1)[1]
    return None


_wanted = _coretype_override(sys.argv[1:])
if _wanted is None and "OPENBLAS_CORETYPE" not in os.environ and _avx512():
    _wanted = "SkylakeX"
if _wanted is not None and os.environ.get("OPENBLAS_CORETYPE") != _wanted:
    os.environ["OPENBLAS_CORETYPE"] = _wanted
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, *sys.argv])

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from _common import machine_header  # noqa: E402
from onnx.backend.test.loader import DATA_DIR  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/
from sporenet.converter import convert_onnx_model  # noqa: E402
from sporenet.lite import Interpreter, serialize  # noqa: E402
from tests.conformance.onnx_backend import LIGHT_MODELS as LIGHT  # noqa: E402
from tests.conformance.onnx_backend import with_real_weights  # noqa: E402

LATENCY = {"squeezenet": 2.5, "resnet50": 1.5}  # model -> allowed ratio to onnxruntime
SIZE_SLACK = 1.01  # .spore may exceed .onnx by at most 1%


def light_path(name: str) -> Path:
    return Path(DATA_DIR) / "light" / f"light_{name}.onnx"


def runner_input(model: onnx.ModelProto) -> tuple[str, np.ndarray]:
    """The input ONNX's backend runner feeds light models: arange(n) / n."""
    inits = {t.name for t in model.graph.initializer}
    value = next(v for v in model.graph.input if v.name not in inits)
    shape = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return value.name, (np.arange(n).reshape(shape) / n).astype(np.float32)


def convert_stats(name: str, path: Path) -> dict:
    start = time.perf_counter()
    ir, report = convert_onnx_model(path)
    data = serialize(ir)
    seconds = time.perf_counter() - start
    return {
        "model": name,
        "convert_s": seconds,
        "onnx_bytes": path.stat().st_size,
        "spore_bytes": len(data),
        "nodes_in": sum(report.onnx_ops.values()),
        "nodes_out": sum(report.ir_ops_after.values()),
        "data": data,
    }


def real_weights_difference(model: onnx.ModelProto, input_name: str, x: np.ndarray) -> float:
    """Largest output difference, relative to the largest output, between sporenet and
    onnxruntime on the model with random weights in place of its constant fills.

    The light models' constant fills make all 1000 logits about 1e10 and tied, so their
    softmax depends on last-bit rounding and its difference says nothing (the
    conformance suite judges such outputs by their logits); the same graph with random
    weights has a well-conditioned output to compare.
    """
    real = with_real_weights(model)
    session = ort.InferenceSession(real.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {input_name: x})[0]
    ir, _ = convert_onnx_model(real)
    got = next(iter(Interpreter(model_content=serialize(ir)).run({input_name: x}).values()))
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def latency(name: str, runs: int) -> dict:
    path = light_path(name)
    model = onnx.load(path)
    input_name, x = runner_input(model)
    ir, _ = convert_onnx_model(path)
    interpreter = Interpreter(model_content=serialize(ir), num_threads=1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    max_rel = real_weights_difference(model, input_name, x)
    spore_t, ort_t = [], []
    for _ in range(runs):  # alternate, so load on the machine hits both alike
        t = time.perf_counter()
        session.run(None, {input_name: x})
        ort_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        interpreter.run({input_name: x})
        spore_t.append(time.perf_counter() - t)
    return {
        "model": name,
        "spore_ms": 1e3 * statistics.median(spore_t),
        "ort_ms": 1e3 * statistics.median(ort_t),
        "spore_min_ms": 1e3 * min(spore_t),
        "ort_min_ms": 1e3 * min(ort_t),
        "max_rel_diff": max_rel,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per engine")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--openblas-coretype", help="OpenBLAS kernel set, e.g. SkylakeX")
    args = parser.parse_args(argv)
    print(
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(auto)')}, "
        f"onnxruntime {ort.__version__}, onnx {onnx.__version__}"
    )
    print(machine_header() + "\n")

    rows = [convert_stats(f"light_{n}", light_path(n)) for n in LIGHT]
    with tempfile.TemporaryDirectory() as tmp:
        for n in ("squeezenet", "resnet50"):
            real = Path(tmp) / f"{n}_real_weights.onnx"
            onnx.save(with_real_weights(onnx.load(light_path(n))), real)
            rows.append(convert_stats(f"{n} (real weights)", real))
    print(f"{'model':<28}{'convert s':>10}{'.onnx':>13}{'.spore':>13}{'ratio':>8}{'nodes':>14}")
    for r in rows:
        print(
            f"{r['model']:<28}{r['convert_s']:>10.2f}{r['onnx_bytes']:>13,}"
            f"{r['spore_bytes']:>13,}{r['spore_bytes'] / r['onnx_bytes']:>8.3f}"
            f"{r['nodes_in']:>7}->{r['nodes_out']:<6}"
        )
    print(
        "  (light_* .onnx files store weights as ConstantOfShape fills: the size target "
        "applies to the real-weight rows)"
    )

    lat = [latency(n, args.runs) for n in LATENCY]
    print(
        f"\n{'batch-1 latency, 1 thread':<28}{'sporenet ms':>12}{'ORT ms':>9}{'ratio':>8}"
        f"{'target':>8}{'min ratio':>11}{'max rel diff':>14}"
    )
    ok = True
    for r in lat:
        ratio = r["spore_ms"] / r["ort_ms"]
        target = LATENCY[r["model"]]
        ok &= ratio <= target
        print(
            f"light_{r['model']:<22}{r['spore_ms']:>12.1f}{r['ort_ms']:>9.1f}{ratio:>8.2f}"
            f"{'<=' + str(target):>8}{r['spore_min_ms'] / r['ort_min_ms']:>11.2f}"
            f"{r['max_rel_diff']:>14.1e}"
        )
    print("  (max rel diff: the same graph with random weights, whose output is well conditioned)")
    for r in rows:
        if "real weights" in r["model"]:
            ok &= r["spore_bytes"] <= SIZE_SLACK * r["onnx_bytes"]
    print(
        f"\ntargets {'met' if ok else 'MISSED'} (median latency ratios; real-weight .spore "
        f"<= {SIZE_SLACK:.2f} x .onnx)"
    )
    if args.json:
        for r in rows:
            r.pop("data", None)
        Path(args.json).write_text(json.dumps({"conversion": rows, "latency": lat}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
