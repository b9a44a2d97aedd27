"""Time of each Conv2D strategy on the 3x3 layers that set lite/kernels/conv.py's thresholds.

For every layer the same prepared kernel is bound once per strategy (im2col, Winograd
F(2x2, 3x3), Winograd F(4x4, 3x3)) and timed in alternating blocks on one thread, so all
three see the same load. The table gives median milliseconds, each Winograd's time over
im2col's, and the strategy the kernel picks on its own; the thresholds
(_WINOGRAD_MIN_CH, _WINOGRAD_MIN_WORK, _WINOGRAD4_MIN_TILES, ...) should pick the fastest
or tie with it.

    python benchmarks/conv_strategies.py           # about a minute
    python benchmarks/conv_strategies.py --quick   # a few seconds, fewer repeats
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

# Timing runs with the CPU's own OpenBLAS kernels: overrides some machines set for old
# OpenBLAS builds are dropped for this process only (read when NumPy loads).
os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from sporenet.lite.eager import prepare_kernel
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.ops import OpCode

LAYERS = [  # (in channels, out channels, height, width) of a 3x3, stride-1, pad-1 layer
    (16, 16, 28, 28),
    (16, 64, 28, 28),
    (32, 128, 27, 27),
    (48, 48, 14, 14),
    (64, 64, 7, 7),
    (64, 64, 16, 16),
    (64, 64, 28, 28),
    (128, 128, 14, 14),
    (128, 128, 28, 28),
    (256, 256, 6, 6),
    (256, 256, 7, 7),
    (256, 256, 14, 14),
    (384, 384, 6, 6),
    (512, 512, 4, 4),
    (512, 512, 7, 7),
    # text-line shapes (a CNN+LSTM recognizer's 64x160 input, ddddocr common_old)
    (24, 24, 32, 80),
    (48, 192, 16, 40),
    (64, 256, 8, 20),
    (64, 64, 8, 20),
    (128, 128, 8, 20),
    (256, 256, 4, 10),
]
STRATEGIES = ("im2col", "winograd", "winograd4")


def time_layer(c: int, o: int, h: int, w_: int, *, blocks: int, calls: int) -> tuple[str, dict]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(w.shape, w.dtype, w)]
    kernel = prepare_kernel(OpCode.CONV2D, {"pads": [1, 1, 1, 1]}, specs, 1)
    chosen = kernel.strategy
    steps = {}
    for strategy in STRATEGIES:
        kernel.strategy = strategy
        out = np.empty(kernel.output_specs[0].shape, np.float32)
        steps[strategy] = (kernel.bind([x, w], [out]), out)
    kernel.strategy = chosen
    reference = None
    times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for _ in range(blocks):
        for strategy, (step, out) in steps.items():
            step()  # warm
            start = time.perf_counter()
            for _ in range(calls):
                step()
            times[strategy].append((time.perf_counter() - start) / calls * 1e3)
            if reference is None:
                reference = out.copy()
            else:
                scale = float(np.abs(reference).max()) or 1.0
                assert float(np.abs(out - reference).max()) / scale < 1e-4, strategy
    return chosen, {s: statistics.median(v) for s, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    blocks, calls = (3, 3) if args.quick else (7, 10)
    with threadpool_limits(1):
        blas = [
            (i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
        ]
        print(f"BLAS (api, kernels, threads): {blas}")
        print(
            f"{'layer':<18}{'im2col ms':>10}{'F2 ms':>8}{'F4 ms':>8}{'F2/im2col':>11}"
            f"{'F4/im2col':>11}  picked"
        )
        for c, o, h, w in LAYERS:
            chosen, ms = time_layer(c, o, h, w, blocks=blocks, calls=calls)
            base = ms["im2col"]
            print(
                f"{f'{c}->{o} {h}x{w}':<18}{base:>10.3f}{ms['winograd']:>8.3f}"
                f"{ms['winograd4']:>8.3f}{ms['winograd'] / base:>11.2f}"
                f"{ms['winograd4'] / base:>11.2f}  {chosen}"
            )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
