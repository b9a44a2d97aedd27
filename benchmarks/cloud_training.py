"""Training speed of sporenet.cloud (graph and eager mode) against PyTorch on CPU, and
data-parallel training against one process.

Digits: the same MLP and the same small CNN (sporenet.cloud.models) are trained on the
8x8 digits training split (1347 images) with the same initial weights, the same shuffled
batches, the same optimizer (Adam) and the same number of threads (BLAS threads for
sporenet, torch.set_num_threads for PyTorch). The table shows the median seconds per
training epoch (validation excluded), the final test accuracy (450 images) and the ratio
to PyTorch. Target: graph mode at most 1.5x PyTorch's epoch time on both nets.

Fashion-MNIST (Debian's dataset-fashion-mnist; skipped with a reason when missing):
- graph-mode training of `models.fashion_cnn` against PyTorch on one thread, seconds per
  epoch over the first --fashion-samples training images (target: at most 0.8x PyTorch);
- DataParallel(workers=2, backend="local") against one process on the same combined
  batches: samples per second and test accuracy after the same samples (target: at
  least 1.6x the throughput on a 2-core machine, the same accuracy).

    python benchmarks/cloud_training.py            # 10 epochs per digits run
    python benchmarks/cloud_training.py --quick    # 3 digits epochs, 2 Fashion epochs
    python benchmarks/cloud_training.py --parts fashion parallel
    python benchmarks/cloud_training.py --parts fashion --clock cpu   # on a shared machine
    python benchmarks/cloud_training.py --parts fashion --clock cpu --fashion-repeats 5
    python benchmarks/cloud_training.py --parts profile   # per-op time of one Fashion step

Needs PyTorch (`pip install torch`) for its rows; without it only sporenet's are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Timing runs with the CPU's own OpenBLAS kernels: overrides some machines set for old
# OpenBLAS builds are dropped for this process only (read when NumPy loads).
os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)

import numpy as np
from _common import machine_header

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud.models import digits_cnn, digits_mlp, fashion_cnn
from sporenet.lite.threads import BLAS

TARGET_RATIO = 1.5
FASHION_TARGET = 0.8  # graph mode's epoch time over PyTorch's, Fashion-MNIST CNN
PARALLEL_TARGET = 1.6  # 2 workers' throughput over one process's
NETS: dict[str, Callable[[], cloud.Sequential]] = {
    "mlp": digits_mlp,
    "cnn": digits_cnn,
}


@dataclass
class Row:
    net: str
    engine: str
    epoch_seconds: float
    accuracy: float


def to_torch(model: cloud.Sequential):
    """The same network in torch.nn with the same weights."""
    import torch
    from torch import nn

    def convert(layer):
        if isinstance(layer, L.Rescale):
            scale, offset = layer.scale, layer.offset

            class Rescale(nn.Module):
                def forward(self, x):
                    return x * scale + offset

            return Rescale()
        if isinstance(layer, L.Flatten):
            return nn.Flatten()
        if isinstance(layer, L.ReLU):
            return nn.ReLU()
        if isinstance(layer, L.MaxPool2d):
            return nn.MaxPool2d(layer.kernel_size, layer.stride)
        if isinstance(layer, L.Dropout):
            return nn.Dropout(layer.p)
        if isinstance(layer, L.BatchNorm2d):
            out = nn.BatchNorm2d(layer.num_features, eps=layer.eps, momentum=layer.momentum)
        elif isinstance(layer, L.Dense):
            out = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        elif isinstance(layer, L.Conv2d):
            out = nn.Conv2d(
                layer.in_channels,
                layer.out_channels,
                layer.kernel_size,
                stride=layer.stride,
                padding=tuple(layer.pads[:2]),
                dilation=layer.dilation,
                groups=layer.groups,
                bias=layer.bias is not None,
            )
        else:
            raise TypeError(f"no torch equivalent for {type(layer).__name__}")
        with torch.no_grad():
            for name, p in out.named_parameters():
                p.copy_(torch.from_numpy(getattr(layer, name).value))
        return out

    return nn.Sequential(*(convert(layer) for layer in model))


def run_sporenet(
    net: str,
    mode: str,
    data,
    args,
    *,
    make=None,
    epochs=None,
    batch_size=None,
    parallel=None,
    callbacks=(),
    cpu_clock=False,
) -> Row:
    cloud.manual_seed(args.seed)
    model = (make or NETS[net])()
    cpu = _CpuTime() if cpu_clock else None
    callbacks = (*callbacks, cpu) if cpu is not None else callbacks
    history = cloud.fit(
        model,
        data.x_train,
        data.y_train,
        epochs=epochs or args.epochs,
        batch_size=batch_size or args.batch_size,
        optimizer=cloud.Adam(lr=args.lr),
        seed=args.seed,
        verbose=0,
        mode=mode,
        num_threads=args.threads,
        parallel=parallel,
        callbacks=callbacks,
    )
    accuracy = cloud.evaluate(model, data.x_test, data.y_test, mode="graph")["accuracy"]
    engine = f"sporenet {mode}" + (f" x{parallel.workers}" if parallel else "")
    times = cpu.driver if cpu is not None else history["time"]
    return Row(net, engine, _epoch_time(times), accuracy)


def run_torch(
    net: str, data, args, *, make=None, epochs=None, batch_size=None, cpu_clock=False
) -> Row:
    import torch

    torch.set_num_threads(args.threads)
    cloud.manual_seed(args.seed)
    model = to_torch((make or NETS[net])())
    args = argparse.Namespace(
        **{
            **vars(args),
            "epochs": epochs or args.epochs,
            "batch_size": batch_size or args.batch_size,
        }
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.from_numpy(data.x_train)
    y = torch.from_numpy(data.y_train)
    times = []
    clock = time.process_time if cpu_clock else time.perf_counter
    for epoch in range(args.epochs):
        model.train()
        # The same batches as cloud.fit: a permutation drawn from (seed, epoch).
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch]).permutation(len(x)))
        start = clock()
        for b in range(0, len(x), args.batch_size):
            idx = order[b : b + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
        times.append(clock() - start)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(data.x_test)).argmax(dim=1).numpy()
    return Row(net, "pytorch", _epoch_time(times), float(np.mean(predicted == data.y_test)))


def _epoch_time(times: list[float]) -> float:
    # The first epoch includes planning and warm-up; the median of the rest is the steady
    # state (with one epoch there is nothing else to report).
    return statistics.median(times[1:] if len(times) > 1 else times)


def print_rows(rows: list[Row], target: float, what: str) -> None:
    print(f"{'net':<8} {'engine':<20} {'s/epoch':>9} {'test acc':>9} {'vs torch':>9}")
    ok = True
    for row in rows:
        ref = next((r for r in rows if r.net == row.net and r.engine == "pytorch"), None)
        ratio = row.epoch_seconds / ref.epoch_seconds if ref else float("nan")
        print(
            f"{row.net:<8} {row.engine:<20} {row.epoch_seconds:>9.4f} {row.accuracy:>9.4f} "
            f"{ratio:>8.2f}x"
        )
        if row.engine == "sporenet graph" and ref is not None and ratio > target:
            ok = False
    if any(r.engine == "pytorch" for r in rows):
        print(f"{what} within {target}x of PyTorch: {'yes' if ok else 'no'}")
    else:
        print("PyTorch is not installed: no reference rows (pip install torch)")


def digits_part(args, have_torch: bool) -> None:
    data = cloud.load_digits()
    rows: list[Row] = []
    cpu = args.clock == "cpu"
    for net in args.nets:
        rows.append(run_sporenet(net, "graph", data, args, cpu_clock=cpu))
        if not args.skip_eager:
            rows.append(run_sporenet(net, "eager", data, args, cpu_clock=cpu))
        if have_torch:
            rows.append(run_torch(net, data, args, cpu_clock=cpu))
    print(
        f"digits train split (1347 images), batch {args.batch_size}, Adam lr {args.lr}, "
        f"{args.epochs} epochs, {args.threads} thread(s), {args.clock} clock"
    )
    print_rows(rows, TARGET_RATIO, "graph mode on every net")


def fashion_data(args):
    from sporenet.cloud.datasets import load_fashion_mnist
    from sporenet.cloud.errors import DatasetError

    try:
        return load_fashion_mnist(train_limit=args.fashion_samples)
    except DatasetError as exc:
        print(f"Fashion-MNIST parts skipped: {exc}")
        return None


def profile_part(args, data) -> None:
    """Per-op time of one graph-mode training step of the Fashion CNN (thread CPU time,
    median over --profile-steps steps of the same batches fit draws), by op kind, and
    the whole step's time: what to look at before changing a kernel."""
    from _profile import profile_calls, summary

    from sporenet.cloud.engines import make_engine

    def plan():
        cloud.manual_seed(args.seed)
        engine = make_engine(
            "graph",
            fashion_cnn(),
            sample_shape=data.x_train.shape[1:],
            loss="softmax_cross_entropy",
            optimizer=cloud.Adam(args.lr),
            label_smoothing=0.0,
            num_threads=args.threads,
        )
        x = np.ascontiguousarray(data.x_train, dtype=np.float32)
        y = data.y_train.astype(np.int64)
        order = np.random.default_rng([args.seed, 0]).permutation(len(x))
        batches = len(x) // args.fashion_batch

        def step(k: int) -> None:
            idx = order[(k % batches) * args.fashion_batch :][: args.fashion_batch]
            engine.step(x[idx], y[idx], args.lr)

        return step

    steps, whole = profile_calls(plan, args.profile_steps, cpu=True)
    print(
        f"\nFashion-MNIST CNN, one graph-mode training step, batch {args.fashion_batch}, "
        f"{args.threads} thread(s), thread CPU time, median of {args.profile_steps} steps: "
        f"{whole * 1e3:.3f} ms"
    )
    print(summary(steps, top=12))


def fashion_part(args, data, have_torch: bool) -> None:
    """Graph mode against PyTorch, run in alternation (sporenet, PyTorch, sporenet, ...)
    --fashion-repeats times, so a shared machine's load weighs on both alike; the verdict
    takes the median of the per-pair ratios."""
    epochs = args.fashion_epochs
    cpu = args.clock == "cpu"
    rows, ratios = [], []
    for _ in range(args.fashion_repeats):
        ours = run_sporenet(
            "fashion",
            "graph",
            data,
            args,
            make=fashion_cnn,
            epochs=epochs,
            batch_size=args.fashion_batch,
            cpu_clock=cpu,
        )
        rows.append(ours)
        if have_torch:
            ref = run_torch(
                "fashion",
                data,
                args,
                make=fashion_cnn,
                epochs=epochs,
                batch_size=args.fashion_batch,
                cpu_clock=cpu,
            )
            rows.append(ref)
            ratios.append(ours.epoch_seconds / ref.epoch_seconds)
    print(
        f"\nFashion-MNIST CNN (models.fashion_cnn), first {len(data.x_train)} training "
        f"images, test 10000, batch {args.fashion_batch}, Adam lr {args.lr}, {epochs} epochs, "
        f"{args.threads} thread(s), {args.clock} clock, {args.fashion_repeats} alternating "
        f"run(s) each; load average {os.getloadavg()[0]:.1f}"
    )
    if len(ratios) < 2:
        print_rows(rows, FASHION_TARGET, "graph mode")
        return
    print(f"{'run':<4} {'engine':<20} {'s/epoch':>9} {'test acc':>9} {'vs torch':>9}")
    for k, ratio in enumerate(ratios):
        for row in rows[2 * k : 2 * k + 2]:
            shown = ratio if row.engine != "pytorch" else 1.0
            print(
                f"{k + 1:<4} {row.engine:<20} {row.epoch_seconds:>9.4f} {row.accuracy:>9.4f} "
                f"{shown:>8.2f}x"
            )
    median = statistics.median(ratios)
    print(
        f"graph mode over PyTorch, median of {len(ratios)} pairs: {median:.2f}x (range "
        f"{min(ratios):.2f}-{max(ratios):.2f}); within {FASHION_TARGET}x: "
        f"{'yes' if median <= FASHION_TARGET else 'no'}"
    )


class _CpuTime(cloud.Callback):
    """CPU seconds of each training epoch: this process's, and each data-parallel worker's
    (read from /proc, so Linux only). On a shared machine the wall-clock ratio depends on
    what else runs; the CPU time says what the work itself costs."""

    def __init__(self) -> None:
        self.driver: list[float] = []
        self.workers: list[list[float]] = []

    @staticmethod
    def _worker_seconds(state) -> list[float]:
        backend = getattr(state.engine, "backend", None)
        pids = getattr(backend, "pids", [])
        ticks = os.sysconf("SC_CLK_TCK")
        out = []
        for pid in pids:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / ticks)  # utime + stime
        return out

    def on_epoch_begin(self, epoch, state):
        self._start = (time.process_time(), self._worker_seconds(state))

    def on_epoch_end(self, epoch, logs, state):
        driver, workers = self._start
        self.driver.append(time.process_time() - driver)
        now = self._worker_seconds(state)
        self.workers.append([b - a for a, b in zip(workers, now, strict=True)])

    def bound(self) -> float:
        """Seconds per epoch (median after the first) if each process had its own core: the
        busiest process, the driver included (it computes shard 0 while the workers compute
        theirs)."""
        rows = list(zip(self.driver, self.workers, strict=True))
        rows = rows[1:] if len(rows) > 1 else rows
        return statistics.median(max([d, *w]) for d, w in rows)


def parallel_part(args, data) -> None:
    """One process against two workers, run in alternation (one, two, one, two, ...) so a
    shared machine's load weighs on both alike; the ratio is taken per pair."""
    epochs = args.fashion_epochs
    batch = args.parallel_batch
    pairs = []
    load_before = os.getloadavg()[0]
    for _ in range(args.parallel_repeats):
        cpu_one, cpu_two = _CpuTime(), _CpuTime()
        one = run_sporenet(
            "fashion",
            "graph",
            data,
            args,
            make=fashion_cnn,
            epochs=epochs,
            batch_size=batch,
            callbacks=[cpu_one],
        )
        two = run_sporenet(
            "fashion",
            "graph",
            data,
            args,
            make=fashion_cnn,
            epochs=epochs,
            batch_size=batch,
            parallel=cloud.DataParallel(workers=2),
            callbacks=[cpu_two],
        )
        pairs.append((one, two, cpu_one.bound() / cpu_two.bound()))
    n = len(data.x_train)
    print(
        f"\nData parallel on Fashion-MNIST: {n} images per epoch, combined batch {batch}, "
        f"{epochs} epochs, {os.cpu_count()} CPU(s); each process one BLAS thread; "
        f"{len(pairs)} alternating pair(s); load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after"
    )
    print(
        "speed-up: wall-clock epoch time over one process's; on own cores: the same from "
        "CPU time (the busiest process, the driver included), what the work costs whatever the load"
    )
    print(f"{'engine':<22} {'samples/s':>10} {'test acc':>9} {'speed-up':>9} {'own cores':>10}")
    for one, two, bound in pairs:
        for row, own in ((one, 1.0), (two, bound)):
            print(
                f"{row.engine:<22} {n / row.epoch_seconds:>10.0f} {row.accuracy:>9.4f} "
                f"{one.epoch_seconds / row.epoch_seconds:>8.2f}x {own:>9.2f}x"
            )
    wall = statistics.median(one.epoch_seconds / two.epoch_seconds for one, two, _ in pairs)
    own = statistics.median(bound for _, _, bound in pairs)
    one, two, _ = pairs[-1]
    print(
        f"2 workers over one process, median of the pairs: {wall:.2f}x wall clock, {own:.2f}x "
        f"on own cores; at least {PARALLEL_TARGET}x: {'yes' if wall >= PARALLEL_TARGET else 'no'}"
        f" (wall clock); accuracy difference after the same samples "
        f"{abs(two.accuracy - one.accuracy):.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 digits, 2 Fashion epochs")
    parser.add_argument("--epochs", type=int, default=None, help="digits epochs (default 10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="seconds per epoch by the wall clock, or this process's CPU time (what the "
        "work costs on a shared machine; data-parallel rows stay wall clock)",
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nets", nargs="+", choices=sorted(NETS), default=["mlp", "cnn"])
    parser.add_argument("--skip-eager", action="store_true", help="leave eager mode out")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["digits", "fashion", "parallel", "profile"],
        default=["digits", "fashion", "parallel"],
        help="profile (not run by default): per-op time of one Fashion CNN training step",
    )
    parser.add_argument("--profile-steps", type=int, default=100)
    parser.add_argument(
        "--fashion-samples",
        type=int,
        default=10000,
        help="Fashion-MNIST training images per epoch (of 60000)",
    )
    parser.add_argument("--fashion-epochs", type=int, default=None, help="default 3 (quick: 2)")
    parser.add_argument("--fashion-batch", type=int, default=64)
    parser.add_argument(
        "--fashion-repeats",
        type=int,
        default=1,
        help="alternating sporenet/PyTorch runs of the Fashion CNN (median ratio)",
    )
    parser.add_argument("--parallel-batch", type=int, default=128)
    parser.add_argument(
        "--parallel-repeats", type=int, default=2, help="alternating one/two-worker pairs"
    )
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (3 if args.quick else 10)
    args.fashion_epochs = args.fashion_epochs or (2 if args.quick else 3)
    BLAS.set(args.threads)  # sporenet's fit also bounds BLAS threads per step
    print(machine_header(), flush=True)

    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    if "digits" in args.parts:
        digits_part(args, have_torch)
    if {"fashion", "parallel", "profile"} & set(args.parts):
        data = fashion_data(args)
        if data is not None and "fashion" in args.parts:
            fashion_part(args, data, have_torch)
        if data is not None and "parallel" in args.parts:
            parallel_part(args, data)
        if data is not None and "profile" in args.parts:
            profile_part(args, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
