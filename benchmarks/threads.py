"""BLAS threads on a shared machine: training and inference with the BLAS library's own
thread count against 1 and 2 threads, each in a fresh subprocess, with the load average
beside every figure.

    python benchmarks/threads.py [--quick]

On a machine whose cores other jobs use, OpenBLAS threads that wait for each other spin
and get descheduled: with its own default (one thread per core) a small model's training
can take ten times as long as with one thread. The runtime's default
(sporenet.lite.threads.default_threads) comes from these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from _common import blas_kernels, clean_env

TRAIN = """
import sys, time, json
import numpy as np
from sporenet import cloud
threads = None if sys.argv[1] == "blas" else int(sys.argv[1])
data = cloud.load_digits()
cloud.manual_seed(0)
model = cloud.models.digits_cnn()
start = time.perf_counter()
cloud.fit(model, data.x_train, data.y_train, epochs=int(sys.argv[2]), batch_size=32,
          optimizer=cloud.Adam(lr=3e-3), seed=0, verbose=0, mode="graph", num_threads=threads)
print(json.dumps(time.perf_counter() - start))
"""

INFER = """
import sys, time, json
import numpy as np
from sporenet import cloud, lite
threads = None if sys.argv[1] == "blas" else int(sys.argv[1])
data = cloud.load_digits()
cloud.manual_seed(0)
path = "/tmp/sporenet-threads-bench.spore"
cloud.export(cloud.models.digits_cnn(), path, input_shape=(1, 8, 8))
interpreter = lite.Interpreter(model_path=path, num_threads=threads)
x = data.x_test[:64]
interpreter.run({"input": x})
times = []
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    interpreter.run({"input": x})
    times.append(time.perf_counter() - start)
print(json.dumps(sorted(times)[len(times) // 2]))
"""


def run(code: str, threads: str, size: int) -> tuple[float, float]:
    """(seconds, load average at the start) of one fresh subprocess."""
    env = clean_env()
    env["SPORENET_THREADS"] = "0"  # the BLAS library's own choice unless the run names one
    load = os.getloadavg()[0]
    out = subprocess.run(
        [sys.executable, "-c", code, threads, str(size)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])), load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 training epoch, 20 inferences")
    p.add_argument("--only", choices=["train", "infer"], help="run one of the two")
    args = p.parse_args()
    epochs, calls = (1, 20) if args.quick else (3, 100)
    print(f"cpus {os.cpu_count()}; BLAS: {blas_kernels()}")
    cases = [
        ("train", f"train digits CNN, {epochs} epochs (graph mode)", TRAIN, epochs, "s"),
        ("infer", "infer digits CNN, batch 64 (median)", INFER, calls, "ms"),
    ]
    for key, name, code, size, unit in cases:
        if args.only and key != args.only:
            continue
        results = {}
        for threads in ("1", "2", "blas"):
            seconds, load = run(code, threads, size)
            results[threads] = seconds
            value = seconds if unit == "s" else seconds * 1e3
            label = "BLAS default" if threads == "blas" else f"{threads} thread(s)"
            print(f"{name:<45} {label:<13} {value:9.2f} {unit}  (load {load:.1f})", flush=True)
        print(
            f"{'':<45} BLAS default / 1 thread: {results['blas'] / results['1']:.2f}x, "
            f"2 / 1: {results['2'] / results['1']:.2f}x"
        )


if __name__ == "__main__":
    main()
