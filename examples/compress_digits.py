"""Compress the digits CNN three ways and print each against its target.

    python examples/compress_digits.py [--epochs N] [--out-dir DIR] [--threads 1]

Prints a line as each stage starts (the whole run takes minutes), then a table with a
column saying whether each row met its target (`MISSED` when not).

1. float: the CNN of examples/train_digits.py, trained by sporenet.cloud and exported.
2. pruned: fine-tuned with magnitude pruning to 80% sparsity (polynomial schedule),
   exported sparse (target: accuracy within 1 point of float, file <= 0.35x), and
   quantized to int8 on top (file <= 0.15x).
3. QAT: BatchNorm folded, fake-quant inserted, fine-tuned, exported to int8 through the
   converter (target: accuracy within 0.2 points of float, file <= 0.3x); plain
   post-training quantization of the float model is printed beside it.
Accuracies are measured from the written files by the lite Interpreter on the test split.
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sporenet import cloud
from sporenet.cloud import compression as C
from sporenet.cloud.datasets import random_shift
from sporenet.cloud.models import digits_cnn
from sporenet.converter.quantize import quantize_model
from sporenet.lite import Interpreter
from sporenet.lite.console import add_threads, apply_threads, make_parser


@dataclass(frozen=True)
class Target:
    """What a compressed row must reach: at most `drop_pt` accuracy points below float,
    at most `size` times the float file."""

    drop_pt: float | None = None
    size: float | None = None

    def text(self) -> str:
        parts = []
        if self.drop_pt is not None:
            parts.append(f"acc >= float - {self.drop_pt} pt")
        if self.size is not None:
            parts.append(f"size <= {self.size}x")
        return ", ".join(parts)

    def met(self, accuracy: float, float_accuracy: float, ratio: float) -> bool:
        ok_acc = self.drop_pt is None or accuracy >= float_accuracy - self.drop_pt / 100 - 1e-9
        return ok_acc and (self.size is None or ratio <= self.size)


def stage(text: str, started: float) -> None:
    print(f"[{time.perf_counter() - started:6.1f} s] {text}", flush=True)


def file_accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    logits = Interpreter(model_path=path).run({"input": x})["logits"]
    return float(np.mean(logits.argmax(axis=1) == y))


def main(argv: list[str] | None = None) -> int:
    parser = make_parser("compress_digits.py", __doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25, help="float training epochs")
    parser.add_argument("--prune-epochs", type=int, default=12)
    parser.add_argument("--qat-epochs", type=int, default=2)
    parser.add_argument("--sparsity", type=float, default=0.8)
    parser.add_argument("--mode", choices=cloud.mode.MODES, default="graph")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=None, help="keep the .spore files here")
    add_threads(parser)
    args = parser.parse_args(argv)
    apply_threads(parser, args.threads)
    started = time.perf_counter()
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="sporenet-compress-"))
    out.mkdir(parents=True, exist_ok=True)

    data = cloud.load_digits()
    x, y, xt, yt = data.x_train, data.y_train, data.x_test, data.y_test
    calibration = x[:200]
    cloud.manual_seed(args.seed)
    model = digits_cnn()
    lr = 3e-3
    stage(f"training the float CNN ({args.epochs} epochs)", started)
    cloud.fit(
        model,
        x,
        y,
        epochs=args.epochs,
        batch_size=32,
        optimizer=cloud.Adam(lr=lr),
        callbacks=[
            cloud.LearningRateScheduler(
                cloud.schedules.CosineLR(lr, total_steps=args.epochs, min_lr=lr / 20)
            )
        ],
        augment=random_shift,
        seed=args.seed,
        verbose=0,
        mode=args.mode,
    )
    cloud.export(model, out / "float.spore", labels=data.labels)
    float_size = (out / "float.spore").stat().st_size
    float_acc = file_accuracy(out / "float.spore", xt, yt)
    rows = [("float", float_size, float_acc, Target())]

    # Magnitude pruning with fine-tuning: the schedule reaches the target at 2/3 of it.
    pruned = copy.deepcopy(model)
    steps = args.prune_epochs * ((len(x) + 31) // 32)
    pruning = C.Pruning(
        C.PolynomialSparsity(args.sparsity, begin_step=0, end_step=2 * steps // 3), frequency=10
    )
    fine_lr = 1e-3
    stage(
        f"pruning to {args.sparsity:.0%} sparsity while fine-tuning ({args.prune_epochs} epochs)",
        started,
    )
    cloud.fit(
        pruned,
        x,
        y,
        epochs=args.prune_epochs,
        batch_size=32,
        optimizer=cloud.Adam(lr=fine_lr),
        callbacks=[
            pruning,
            cloud.LearningRateScheduler(
                cloud.schedules.CosineLR(
                    fine_lr, total_steps=args.prune_epochs, min_lr=fine_lr / 20
                )
            ),
        ],
        augment=random_shift,
        seed=args.seed + 1,
        verbose=0,
        mode=args.mode,
    )
    sparsity = C.sparsity_of(C.prunable_weights(pruned).values())
    C.export_sparse(pruned, out / "pruned.spore", labels=data.labels)
    C.sparse_int8(pruned, calibration, path=out / "pruned_int8.spore", labels=data.labels)
    for name, target in (
        ("pruned", Target(drop_pt=1.0, size=0.35)),
        ("pruned_int8", Target(size=0.15)),
    ):
        path = out / f"{name}.spore"
        rows.append(
            (
                f"{name} ({sparsity:.0%} sparse)",
                path.stat().st_size,
                file_accuracy(path, xt, yt),
                target,
            )
        )

    # Post-training quantization of the float model, for reference.
    stage("post-training quantization to int8", started)
    ptq = quantize_model(
        cloud.to_inference_ir(model, labels=data.labels),
        calibration={"input": calibration[:100]},
        report=False,
    )
    (out / "ptq_int8.spore").write_bytes(ptq.data)
    rows.append(
        (
            "ptq int8 (100 samples)",
            len(ptq.data),
            file_accuracy(out / "ptq_int8.spore", xt, yt),
            Target(drop_pt=0.5),
        )
    )

    # Quantization-aware training from the float model.
    qat = C.prepare_qat(model, calibration)
    # A short fine-tune at a small learning rate: the float weights are already good,
    # training only adapts them (and the ranges) to the int8 rounding.
    qat_lr = 3e-5
    stage(f"quantization-aware training ({args.qat_epochs} epochs)", started)
    cloud.fit(
        qat,
        x,
        y,
        epochs=args.qat_epochs,
        batch_size=32,
        optimizer=cloud.Adam(lr=qat_lr),
        seed=args.seed + 2,
        verbose=0,
        mode=args.mode,
    )
    result = C.export_int8(qat, calibration, labels=data.labels, report=False)
    (out / "qat_int8.spore").write_bytes(result.data)
    rows.append(
        (
            "qat int8",
            len(result.data),
            file_accuracy(out / "qat_int8.spore", xt, yt),
            Target(drop_pt=0.2, size=0.3),
        )
    )

    print(f"digits CNN, {len(yt)} test images, files in {out}")
    print(
        f"{'model':28} {'bytes':>8} {'x float':>8} {'accuracy':>9} {'vs float':>9}  "
        f"{'met':6}  target"
    )
    missed = 0
    for name, size, acc, target in rows:
        ratio = size / float_size
        met = target.met(acc, float_acc, ratio)
        missed += not met
        print(
            f"{name:28} {size:8d} {ratio:8.3f} {acc:9.4f} "
            f"{100 * (acc - float_acc):+8.2f}pt  {'yes' if met else 'MISSED':6}  {target.text()}"
        )
    if missed:
        print(f"{missed} row(s) missed their target", file=sys.stderr)
    return 0


def run(argv: list[str] | None = None) -> int:
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(run())
