"""Training speed of sporenet.cloud (graph and eager mode) against PyTorch on CPU.

The same MLP and the same small CNN (sporenet.cloud.models) are trained on the 8x8 digits
training split (1347 images) with the same initial weights, the same shuffled batches,
the same optimizer (Adam) and the same number of threads (BLAS threads for sporenet,
torch.set_num_threads for PyTorch). The table shows the median seconds per training epoch
(validation excluded), the final test accuracy (450 images) and the ratio to PyTorch.

    python benchmarks/cloud_training.py            # 10 epochs per run (a few minutes)
    python benchmarks/cloud_training.py --quick    # 3 epochs, for a smoke run

Target: graph mode at most 1.5x PyTorch's epoch time on both nets. Needs PyTorch
(`pip install torch`) for its rows; without it only the sporenet rows are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

# Timing runs with the CPU's own OpenBLAS kernels: overrides some machines set for old
# OpenBLAS builds are dropped for this process only (read when NumPy loads).
os.environ.pop("OPENBLAS_CORETYPE", None)
os.environ.pop("OPENBLAS_L2_SIZE", None)

import numpy as np
from _common import machine_header

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud.models import digits_cnn, digits_mlp
from sporenet.lite.threads import BLAS

TARGET_RATIO = 1.5
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


def run_sporenet(net: str, mode: str, data, args) -> Row:
    cloud.manual_seed(args.seed)
    model = NETS[net]()
    history = cloud.fit(
        model,
        data.x_train,
        data.y_train,
        epochs=args.epochs,
        batch_size=args.batch_size,
        optimizer=cloud.Adam(lr=args.lr),
        seed=args.seed,
        verbose=0,
        mode=mode,
        num_threads=args.threads,
    )
    accuracy = cloud.evaluate(model, data.x_test, data.y_test, mode=mode)["accuracy"]
    return Row(net, f"sporenet {mode}", _epoch_time(history["time"]), accuracy)


def run_torch(net: str, data, args) -> Row:
    import torch

    torch.set_num_threads(args.threads)
    cloud.manual_seed(args.seed)
    model = to_torch(NETS[net]())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.from_numpy(data.x_train)
    y = torch.from_numpy(data.y_train)
    times = []
    for epoch in range(args.epochs):
        model.train()
        # The same batches as cloud.fit: a permutation drawn from (seed, epoch).
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch]).permutation(len(x)))
        start = time.perf_counter()
        for b in range(0, len(x), args.batch_size):
            idx = order[b : b + args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(data.x_test)).argmax(dim=1).numpy()
    return Row(net, "pytorch", _epoch_time(times), float(np.mean(predicted == data.y_test)))


def _epoch_time(times: list[float]) -> float:
    # The first epoch includes planning and warm-up; the median of the rest is the steady
    # state (with one epoch there is nothing else to report).
    return statistics.median(times[1:] if len(times) > 1 else times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 epochs per run")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 10)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nets", nargs="+", choices=sorted(NETS), default=["mlp", "cnn"])
    parser.add_argument("--skip-eager", action="store_true", help="leave eager mode out")
    args = parser.parse_args(argv)
    args.epochs = args.epochs or (3 if args.quick else 10)
    BLAS.set(args.threads)  # sporenet's fit also bounds BLAS threads per step
    print(machine_header(), flush=True)

    data = cloud.load_digits()
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    rows: list[Row] = []
    for net in args.nets:
        rows.append(run_sporenet(net, "graph", data, args))
        if not args.skip_eager:
            rows.append(run_sporenet(net, "eager", data, args))
        if have_torch:
            rows.append(run_torch(net, data, args))

    print(
        f"digits train split (1347 images), batch {args.batch_size}, Adam lr {args.lr}, "
        f"{args.epochs} epochs, {args.threads} thread(s)"
    )
    print(f"{'net':<5} {'engine':<16} {'s/epoch':>9} {'test acc':>9} {'vs torch':>9}")
    ok = True
    for row in rows:
        ref = next((r for r in rows if r.net == row.net and r.engine == "pytorch"), None)
        ratio = row.epoch_seconds / ref.epoch_seconds if ref else float("nan")
        print(
            f"{row.net:<5} {row.engine:<16} {row.epoch_seconds:>9.4f} {row.accuracy:>9.4f} "
            f"{ratio:>8.2f}x"
        )
        if row.engine == "sporenet graph" and ref is not None and ratio > TARGET_RATIO:
            ok = False
    if not have_torch:
        print("PyTorch is not installed: no reference rows (pip install torch)")
    else:
        print(f"graph mode within {TARGET_RATIO}x of PyTorch on every net: {'yes' if ok else 'no'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
