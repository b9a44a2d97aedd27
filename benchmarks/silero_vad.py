"""Silero VAD (If subgraphs, LSTM) in sporenet.lite against onnxruntime, one thread.

The model is silero_vad/data/silero_vad.onnx from the `silero-vad` PyPI package (installed,
or named with --model). It is converted once per chunk size and then streamed chunk by
chunk with its carried state, as a voice-activity detector runs. Timing runs in a child
process without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, alternating sporenet and onnxruntime
calls so both see the same machine load; the table shows median latencies, their ratio,
the largest output difference relative to onnxruntime's largest magnitude, the BLAS kernel
that ran (threadpoolctl) and the child's peak RSS.

    python benchmarks/silero_vad.py [--model PATH] [--repeats 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import cpu_description
from _packaged_models import PACKAGED_MODELS, model_path

CASES = ((512, 16000), (256, 8000))


def _default_model() -> Path | None:
    return model_path(next(m for m in PACKAGED_MODELS if m.name == "silero-vad"))


def _child(model: str, repeats: int) -> dict:
    import numpy as np
    import onnxruntime as ort
    from threadpoolctl import threadpool_info

    from sporenet.converter import convert_onnx
    from sporenet.lite import Interpreter

    results = []
    for chunk, rate in CASES:
        interpreter = Interpreter(
            model_content=convert_onnx(
                model, input_shapes={"input": (1, chunk), "state": (2, 1, 128)}
            ),
            num_threads=1,
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        audio = (0.1 * rng.standard_normal(chunk * repeats)).astype(np.float32)
        state = np.zeros((2, 1, 128), np.float32)
        ours, theirs, worst = [], [], 0.0
        for k in range(repeats):
            feeds = {
                "input": audio[None, k * chunk : (k + 1) * chunk],
                "state": state,
                "sr": np.array(rate, np.int64),
            }
            t0 = time.perf_counter()
            got = interpreter.run(feeds)
            t1 = time.perf_counter()
            want = session.run(None, feeds)
            t2 = time.perf_counter()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
            for g, w in zip((got["output"], got["stateN"]), want, strict=True):
                worst = max(worst, float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-12)))
            state = want[1]
        results.append(
            {
                "chunk": chunk,
                "rate": rate,
                "sporenet_ms": statistics.median(ours) * 1e3,
                "onnxruntime_ms": statistics.median(theirs) * 1e3,
                "max_rel_diff": worst,
            }
        )
    blas = [f"{i.get('internal_api')} {i.get('architecture')}" for i in threadpool_info()]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"results": results, "blas": blas, "peak_rss_mb": peak_mb}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = args.model or _default_model()
    if model is None:
        print("silero_vad.onnx not found: install silero-vad or pass --model PATH")
        return 2
    if args.child:
        print(json.dumps(_child(str(model), args.repeats)))
        return 0
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            "--model",
            str(model),
            "--repeats",
            str(args.repeats),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    print(f"model: {model}  (one thread, {args.repeats} streamed chunks per case)")
    print(
        f"{'chunk':>6} {'rate':>6} {'sporenet ms':>12} {'onnxruntime ms':>15} {'ratio':>6} "
        f"{'max rel diff':>13}"
    )
    for r in report["results"]:
        ratio = r["sporenet_ms"] / r["onnxruntime_ms"]
        print(
            f"{r['chunk']:>6} {r['rate']:>6} {r['sporenet_ms']:>12.3f} "
            f"{r['onnxruntime_ms']:>15.3f} {ratio:>6.2f} {r['max_rel_diff']:>13.2e}"
        )
    print(f"CPU: {cpu_description()}")
    print(f"BLAS: {', '.join(report['blas'])}; child peak RSS {report['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
