"""The fleet simulator: N virtual devices against a real sporenet-server, on one machine
(`local`) or on a Ray cluster (`ray`), through one code path.

Both backends split the devices into groups and run `DeviceGroup.run` for each: `local`
in this process (every group's devices are coroutines on its one transport loop), `ray`
in Ray actors (one group each), which return their records. The driver merges the
records, evaluates each round's global model on the held-out test data with the lite
Interpreter, and reports accuracy per round, round times, bytes moved and dropouts.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sporenet import lite
from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet import partition
from sporenet.android_demo.fleet.devices import DeviceGroup, GroupReport
from sporenet.android_demo.fleet.profile import FleetProfile, draw_traits
from sporenet.android_demo.fleet.progress import RoundMonitor, Say, wait_for_server
from sporenet.android_demo.head import find_head
from sporenet.android_demo.model import logits_output

BACKENDS = ("local", "ray")
DIGITS_TRAIN_SIZE = 1347  # the split cloud.load_digits uses: the first 1347 train
EVAL_BATCH = 64


def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) of the 8x8 digits, images (N, 1, 8, 8) 0..16.

    Read straight from the CSV file scikit-learn ships (importing scikit-learn would add
    tens of MB to every simulator process for one small table).
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise AppError(
            "the fleet simulator's data is scikit-learn's digits: pip install 'sporenet[datasets]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets/data/digits.csv.gz"
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    except OSError as exc:
        raise AppError(f"could not read the digits data at {str(path)!r}: {exc}") from None
    x = np.ascontiguousarray(table[:, :64]).reshape(-1, 1, 8, 8)
    y = table[:, 64].astype(np.int64)
    n = DIGITS_TRAIN_SIZE
    return x[:n], y[:n], x[n:], y[n:]


COLUMNS = (
    "accuracy: the round's published global model on the digits test split",
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
) -> list[dict[str, Any]]:
    """The keyword arguments of each group's DeviceGroup (plain data: Ray ships them)."""
    x, y, _, _ = load_digits()
    rng = np.random.default_rng([profile.seed, 0])
    parts = (
        partition.iid(len(y), devices, rng)
        if profile.partition == "iid"
        else partition.dirichlet(y, devices, profile.alpha, rng)
    )
    traits = draw_traits(profile, devices)
    trainable = head_parameters(lite.parse(model)) if head_only else None
    per = math.ceil(devices / groups)
    return [
        {
            "model": model,
            "x": x,
            "y": y,
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


def run_local(address: str, args: list[dict[str, Any]], timeout: float) -> list[GroupReport]:
    reports: list[GroupReport | None] = [None] * len(args)

    def run(k: int) -> None:
        reports[k] = DeviceGroup(**args[k]).run(address, timeout=timeout)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 60)
    return [r if r is not None else GroupReport(errors=["group did not finish"]) for r in reports]


class _GroupActor:
    """A Ray actor holding one DeviceGroup (the same code the local backend runs)."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.group = DeviceGroup(**kwargs)

    def run(self, address: str, timeout: float) -> GroupReport:
        return self.group.run(address, timeout=timeout)


def run_ray(
    address: str, args: list[dict[str, Any]], timeout: float, ray_address: str | None
) -> list[GroupReport]:
    try:
        import ray
    except ImportError:
        raise AppError("the ray backend needs Ray: pip install 'sporenet[fleet-ray]'") from None
    started = False
    if not ray.is_initialized():
        local = {} if ray_address else {"_node_ip_address": "127.0.0.1"}  # loopback only
        ray.init(
            address=ray_address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            **local,
        )
        started = True
    try:
        actor = ray.remote(num_cpus=0)(_GroupActor)
        actors = [actor.remote(a) for a in args]
        return ray.get([a.run.remote(address, timeout) for a in actors], timeout=timeout + 120)
    finally:
        if started:
            ray.shutdown()


def simulate(
    address: str,
    model: bytes,
    *,
    devices: int,
    rounds: int,
    profile: FleetProfile | None = None,
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
    `rounds` is how many rounds the server runs (the report covers 1..rounds). Each group
    trains its devices on `workers` threads. `say` (when given) hears a line per round
    and whether the server can be reached.

    Raises:
        ServerUnreachableError: the server did not accept a connection within
            `connect_timeout` seconds.
    """
    if backend not in BACKENDS:
        raise AppError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if devices < 1 or rounds < 1 or workers < 1:
        raise AppError(
            f"devices, rounds and workers must be >= 1, got {devices}, {rounds} and {workers}"
        )
    profile = profile or FleetProfile()
    groups = groups or (1 if backend == "local" else 2)
    args = group_args(
        model,
        devices,
        profile,
        groups,
        head_only=head_only,
        train_config=train_config or {},
        workers=workers,
    )
    tell: Say = say or (lambda line: None)
    wait_for_server(address, give_up_after=connect_timeout, say=tell)
    start = time.time()
    with RoundMonitor(address, rounds=rounds, devices=devices, say=tell):
        reports = (
            run_local(address, args, timeout)
            if backend == "local"
            else run_ray(address, args, timeout, ray_address)
        )
    report = FleetReport(devices=devices, backend=backend, wall_seconds=time.time() - start)
    base = lite.parse(model)
    _, _, x_test, y_test = load_digits()
    report.initial_accuracy = accuracy(base, base.weights(), x_test, y_test)
    weights: dict[int, dict[str, np.ndarray]] = {}
    for g in reports:
        report.offline_periods += g.offline_periods
        report.errors += g.errors
        for r, w in g.weights.items():
            weights.setdefault(r, w)
    final = next((g.final for g in reports if g.final is not None), None)
    done = min(g.done_time for g in reports)
    last = max((r for g in reports for r in g.rounds), default=0)
    for r in range(1, rounds + 1):
        records = [g.rounds[r] for g in reports if r in g.rounds]
        seen = min((rec.first_seen for rec in records), default=math.inf)
        # A round's result is the next round's global model; the last round the server
        # ran (which may be before `rounds`) ends with the final one.
        after = weights.get(r + 1) or (final if r == last else None)
        nxt = min(
            (g.rounds[r + 1].first_seen for g in reports if r + 1 in g.rounds),
            default=done if r == last else math.inf,
        )
        report.rounds.append(
            RoundStats(
                round=r,
                accuracy=accuracy(base, after, x_test, y_test) if after is not None else math.nan,
                seconds=nxt - seen if math.isfinite(nxt - seen) else math.nan,
                trained=sum(rec.trained for rec in records),
                dropped_train=sum(rec.dropped_train for rec in records),
                dropped_upload=sum(rec.dropped_upload for rec in records),
                bytes=sum(rec.bytes for rec in records),
            )
        )
    return report
