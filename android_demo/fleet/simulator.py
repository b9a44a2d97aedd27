"""The fleet simulator: N virtual devices against a real sporenet-server, in this
process, in child processes or on a Ray cluster (backends.py), through one code path.

Every backend splits the devices into groups and runs `DeviceGroup.run` for each, which
returns its records. The driver merges the records, evaluates each round's global model
on the dataset's held-out test data (data.py) with the lite Interpreter, and reports
accuracy per round, round times, bytes moved and dropouts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sporenet import lite
from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet import data as datasets
from sporenet.android_demo.fleet.backends import BACKENDS, make_backend
from sporenet.android_demo.fleet.data import FleetData
from sporenet.android_demo.fleet.devices import GroupReport
from sporenet.android_demo.fleet.partition import PARTITIONS
from sporenet.android_demo.fleet.profile import FleetProfile, draw_traits
from sporenet.android_demo.fleet.progress import RoundMonitor, Say, wait_for_server
from sporenet.android_demo.head import find_head
from sporenet.android_demo.model import logits_output

__all__ = ["BACKENDS", "FleetReport", "RoundStats", "group_args", "simulate"]
EVAL_BATCH = 64


COLUMNS = (
    "accuracy: the round's published global model on the dataset's test split",
    "seconds: from the devices first seeing the round's model to the next one",
    "uploaded: devices whose update the server accepted (a device dropped in a first "
    "attempt and selected again counts in both columns)",
    "dropped training / upload: devices that vanished while training / before their "
    "update was sent (the profile's dropout_train / dropout_upload)",
    "MB: model downloads and update uploads the devices moved",
)


@dataclass
class RoundStats:
    """One round as the fleet saw it."""

    round: int
    accuracy: float
    seconds: float
    trained: int
    dropped_train: int
    dropped_upload: int
    bytes: int
    devices: list[int] = field(default_factory=list)  # whose updates were sent, sorted


@dataclass
class FleetReport:
    """A simulation's results."""

    devices: int
    backend: str
    rounds: list[RoundStats] = field(default_factory=list)
    initial_accuracy: float = float("nan")
    wall_seconds: float = 0.0
    offline_periods: int = 0
    errors: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The rounds as a table, and what each column means."""
        lines = [
            f"{'round':>5} {'accuracy':>8} {'seconds':>8} {'uploaded':>8} "
            f"{'dropped training':>16} {'dropped upload':>14} {'MB':>8}"
        ]
        lines += [
            f"{r.round:>5} {r.accuracy:>8.4f} {r.seconds:>8.3f} {r.trained:>8} "
            f"{r.dropped_train:>16} {r.dropped_upload:>14} {r.bytes / 1e6:>8.2f}"
            if math.isfinite(r.accuracy)
            else f"{r.round:>5}  not run (no global model of this round was seen)"
            for r in self.rounds
        ]
        return "\n".join([*lines, "", *COLUMNS])

    def missing(self) -> list[int]:
        """Rounds of which no global model was seen (the server's job ended before them,
        or the simulation timed out)."""
        return [r.round for r in self.rounds if not math.isfinite(r.accuracy)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "backend": self.backend,
            "initial_accuracy": self.initial_accuracy,
            "wall_seconds": self.wall_seconds,
            "offline_periods": self.offline_periods,
            "errors": self.errors[:20],
            "rounds": [vars(r) for r in self.rounds],
        }


def head_parameters(model: lite.Model) -> set[str]:
    """The weights of the model's head (the layer producing its logits), which the devices
    train unless --all-weights."""
    head = find_head(model, logits_output(model))
    if not head.available:
        raise AppError(f"the devices cannot train this model's head: {head.reason}")
    return set(head.names)


def fresh_head(model: bytes, seed: int = 0) -> bytes:
    """`model` with its head re-initialized (Glorot-uniform weights, zero biases), so a
    pretrained backbone's curve starts from chance instead of a flat line at the top."""
    ir = lite.parse(model)
    rng = np.random.default_rng([seed, 1])
    weights = ir.weights()
    new = {}
    for name in sorted(head_parameters(ir)):
        w = weights[name]
        if w.ndim < 2:
            new[name] = np.zeros_like(w)
            continue
        fan_out, fan_in = w.shape[0], int(np.prod(w.shape[1:]))
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        new[name] = rng.uniform(-limit, limit, w.shape).astype(w.dtype)
    return lite.serialize(lite.replace_weights(ir, new))


def accuracy(
    model: lite.Model, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> float:
    """Top-1 accuracy of `model` with `weights` on (x, y), in batches: a plan for the whole
    test set at once would hold every layer's activations for all of it."""
    tuned = lite.replace_weights(model, weights)
    name = next(iter(tuned.signature("infer").inputs))
    output = logits_output(tuned)
    interpreter = lite.Interpreter(model=tuned)
    right = 0
    for at in range(0, len(y), EVAL_BATCH):
        logits = interpreter.run({name: x[at : at + EVAL_BATCH]})[output]
        right += int(np.sum(logits.argmax(axis=1) == y[at : at + EVAL_BATCH]))
    return right / len(y)


def group_args(
    model: bytes,
    devices: int,
    profile: FleetProfile,
    groups: int,
    *,
    head_only: bool,
    train_config: dict[str, Any],
    workers: int = 1,
    data: FleetData | None = None,
) -> list[dict[str, Any]]:
    """The keyword arguments of each group's DeviceGroup (plain data: Ray ships them).
    `data` defaults to the digits."""
    data = data if data is not None else datasets.load_digits()
    rng = np.random.default_rng([profile.seed, 0])
    parts = PARTITIONS[profile.partition](data.y, data.owners, devices, profile.alpha, rng)
    traits = draw_traits(profile, devices)
    trainable = head_parameters(lite.parse(model)) if head_only else None
    per = math.ceil(devices / groups)
    return [
        {
            "model": model,
            "x": data.x,
            "y": data.y,
            "partitions": parts[a : a + per],
            "traits": traits[a : a + per],
            "first_index": a,
            "trainable": trainable,
            "simulate_time": profile.simulate_time,
            "seed": profile.seed,
            "workers": workers,
            **train_config,
        }
        for a in range(0, devices, per)
    ]


def simulate(
    address: str,
    model: bytes,
    *,
    devices: int,
    rounds: int,
    profile: FleetProfile | None = None,
    data: FleetData | str = "digits",
    backend: str = "local",
    groups: int | None = None,
    ray_address: str | None = None,
    head_only: bool = True,
    train_config: dict[str, Any] | None = None,
    workers: int = 1,
    timeout: float = 3600.0,
    connect_timeout: float = 30.0,
    say: Say | None = None,
) -> FleetReport:
    """Run `devices` virtual devices against the server at `address` until its job ends;
    `rounds` is how many rounds the server runs (the report covers 1..rounds). `data` is
    a dataset name of data.DATASETS or loaded data; the profile says how it is split.
    Each group trains its devices on `workers` threads. `say` (when given) hears a line
    per round and whether the server can be reached.

    Raises:
        ServerUnreachableError: the server did not accept a connection within
            `connect_timeout` seconds.
    """
    runner = make_backend(backend, ray_address=ray_address)
    if devices < 1 or rounds < 1 or workers < 1:
        raise AppError(
            f"devices, rounds and workers must be >= 1, got {devices}, {rounds} and {workers}"
        )
    profile = profile or FleetProfile()
    data = datasets.load(data) if isinstance(data, str) else data
    args = group_args(
        model,
        devices,
        profile,
        groups or runner.default_groups,
        head_only=head_only,
        train_config=train_config or {},
        workers=workers,
        data=data,
    )
    tell: Say = say or (lambda line: None)
    wait_for_server(address, give_up_after=connect_timeout, say=tell)
    start = time.time()
    with RoundMonitor(address, rounds=rounds, devices=devices, say=tell):
        reports = runner.run(address, args, timeout)
    report = FleetReport(devices=devices, backend=backend, wall_seconds=time.time() - start)
    score_rounds(report, reports, lite.parse(model), data, rounds)
    return report


def score_rounds(
    report: FleetReport, groups: list[GroupReport], base: lite.Model, data: FleetData, rounds: int
) -> None:
    """Merge the groups' records into `report`: per round, the test accuracy of the model
    the round published, its time, devices and bytes."""
    report.initial_accuracy = accuracy(base, base.weights(), data.x_test, data.y_test)
    weights: dict[int, dict[str, np.ndarray]] = {}
    for g in groups:
        report.offline_periods += g.offline_periods
        report.errors += g.errors
        for r, w in g.weights.items():
            weights.setdefault(r, w)
    final = next((g.final for g in groups if g.final is not None), None)
    done = min(g.done_time for g in groups)
    last = max((r for g in groups for r in g.rounds), default=0)
    for r in range(1, rounds + 1):
        records = [g.rounds[r] for g in groups if r in g.rounds]
        seen = min((rec.first_seen for rec in records), default=math.inf)
        # A round's result is the next round's global model; the last round the server
        # ran (which may be before `rounds`) ends with the final one.
        after = weights.get(r + 1) or (final if r == last else None)
        nxt = min(
            (g.rounds[r + 1].first_seen for g in groups if r + 1 in g.rounds),
            default=done if r == last else math.inf,
        )
        report.rounds.append(
            RoundStats(
                round=r,
                accuracy=(
                    accuracy(base, after, data.x_test, data.y_test)
                    if after is not None
                    else math.nan
                ),
                seconds=nxt - seen if math.isfinite(nxt - seen) else math.nan,
                trained=sum(rec.trained for rec in records),
                dropped_train=sum(rec.dropped_train for rec in records),
                dropped_upload=sum(rec.dropped_upload for rec in records),
                bytes=sum(rec.bytes for rec in records),
                devices=sorted(d for rec in records for d in rec.devices),
            )
        )
