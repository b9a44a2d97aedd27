"""Time of each Conv2D strategy on the 3x3 layers that set conv_strategy.py's thresholds.

For every layer the same prepared kernel is bound once per strategy (im2col, Winograd
F(2x2, 3x3), Winograd F(4x4, 3x3)) and timed in alternating blocks on one thread, so all
three see the same load. The table gives median milliseconds, each Winograd's time over
im2col's, and the strategy `conv_strategy.choose` picks on its own; its thresholds
(_WINOGRAD_MIN_CH, _WINOGRAD_MIN_WORK, _WINOGRAD4_MIN_TILES, ...) should pick the fastest
or tie with it. Winograd is also timed with its input and output stored channels-last
(the "last" columns), as a plan stores them when the neighbouring layers accept it.

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
from _common import cpu_description
from threadpoolctl import threadpool_info, threadpool_limits

from sporenet.lite.eager import prepare_kernel
from sporenet.lite.kernels.base import TensorSpec
from sporenet.lite.kernels.conv_strategy import ConvStrategy
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
# (strategy, input and output stored channels-last) pairs timed per layer.
VARIANTS = [(s, False) for s in STRATEGIES] + [("winograd", True), ("winograd4", True)]


def _stored(a: np.ndarray, channels_last: bool) -> np.ndarray:
    """`a` (N, C, H, W) as a plan stores it: contiguous, or a view of NHWC memory."""
    if not channels_last:
        return a
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def time_layer(
    c: int, o: int, h: int, w_: int, *, blocks: int, calls: int
) -> tuple[str, dict[tuple[str, bool], float]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, h, w_)).astype(np.float32)
    w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(w.shape, w.dtype, w)]
    kernel = prepare_kernel(OpCode.CONV2D, {"pads": [1, 1, 1, 1]}, specs, 1)
    chosen = kernel.strategy
    steps = {}
    for strategy, last in VARIANTS:
        kernel.force_strategy(ConvStrategy(strategy))
        out = _stored(np.empty(kernel.output_specs[0].shape, np.float32), last)
        steps[strategy, last] = (kernel.bind([_stored(x, last), w], [out]), out)
    reference = None
    times: dict[tuple[str, bool], list[float]] = {v: [] for v in VARIANTS}
    for _ in range(blocks):
        for variant, (step, out) in steps.items():
            step()  # warm
            start = time.perf_counter()
            for _ in range(calls):
                step()
            times[variant].append((time.perf_counter() - start) / calls * 1e3)
            if reference is None:
                reference = out.copy()
            else:
                scale = float(np.abs(reference).max()) or 1.0
                assert float(np.abs(out - reference).max()) / scale < 1e-4, variant
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
        print(f"CPU: {cpu_description()}")
        print(f"BLAS (api, kernels, threads): {blas}")
        print(
            f"{'layer':<18}{'im2col ms':>10}{'F2 ms':>8}{'F4 ms':>8}{'F2/im2col':>11}"
            f"{'F4/im2col':>11}{'F2 last':>9}{'F4 last':>9}  picked"
        )
        for c, o, h, w in LAYERS:
            chosen, ms = time_layer(c, o, h, w, blocks=blocks, calls=calls)
            base = ms["im2col", False]
            f2, f4 = ms["winograd", False], ms["winograd4", False]
            print(
                f"{f'{c}->{o} {h}x{w}':<18}{base:>10.3f}{f2:>8.3f}{f4:>8.3f}{f2 / base:>11.2f}"
                f"{f4 / base:>11.2f}{ms['winograd', True]:>9.3f}{ms['winograd4', True]:>9.3f}"
                f"  {chosen}"
            )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
