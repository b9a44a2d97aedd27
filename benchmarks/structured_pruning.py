"""Latency of the ResNet-18-style net of benchmarks/lite_inference.py after structured
channel pruning (sporenet.cloud.compression.prune_channels) against the unpruned net,
both in sporenet's Interpreter at batch 1, in alternating blocks (median of single calls).

    python benchmarks/structured_pruning.py [--ratio 0.5] [--threads 1] [--quick]

Target (issue 15): pruning half the channels gives latency <= 0.6x the unpruned net's.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lite_inference as li  # chooses the OpenBLAS kernels before NumPy loads
import numpy as np
from _common import cpu_description
from threadpoolctl import threadpool_info

from sporenet.cloud.compression import channel_counts, prune_channels
from sporenet.lite import Interpreter, parse, serialize

TARGET = 0.6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratio", type=float, default=0.5, help="fraction of channels removed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    twin = li.resnet18()
    data, _ = twin.finish(twin.y)
    model = parse(data)
    pruned = prune_channels(model, args.ratio)
    pruned_data = serialize(pruned)
    x = np.random.default_rng(1).normal(size=twin.input_shape).astype(np.float32)
    full = Interpreter(model_content=data, num_threads=args.threads)
    small = Interpreter(model_content=pruned_data, num_threads=args.threads)
    budget, min_runs = (1.0, 5) if args.quick else (6.0, 20)
    t_full, t_small = li.paired_timings(
        [lambda: full.run({"x": x}), lambda: small.run({"x": x})], budget, min_runs
    )
    blas = [
        (i.get("internal_api"), i.get("architecture"), i.get("num_threads"))
        for i in threadpool_info()
    ]
    convs = list(channel_counts(model).values())
    kept = list(channel_counts(pruned).values())
    ratio = statistics.median(t_small) / statistics.median(t_full)
    print(f"CPU: {cpu_description()}")
    print(f"BLAS: {blas}   OpenBLAS core: {li._openblas_core()}")
    print(
        f"ResNet-18-style, batch 1, {args.threads} thread(s), {args.ratio:.0%} of channels "
        f"removed: {sum(convs)} -> {sum(kept)} output channels over {len(convs)} layers"
    )
    print(
        f"file        {len(data):>12,d} -> {len(pruned_data):,d} bytes "
        f"({len(pruned_data) / len(data):.2f}x)"
    )
    print(
        f"median      {statistics.median(t_full) * 1e3:9.2f} ms -> "
        f"{statistics.median(t_small) * 1e3:.2f} ms  ratio {ratio:.2f} (target <= {TARGET})"
        f"{'' if ratio <= TARGET else '  MISSED'}"
    )
    print(
        f"best-of     {min(t_full) * 1e3:9.2f} ms -> {min(t_small) * 1e3:.2f} ms  "
        f"ratio {min(t_small) / min(t_full):.2f}"
    )
    print(f"peak RSS    {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
