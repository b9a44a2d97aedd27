"""Federated round benchmark: sporenet-server vs Flower's FedAvg on the same loopback
workload, and sporenet's device-edge-cloud tiers against the same devices sent straight
to the cloud.

Comparison with Flower. For each number of clients N and model size P: one server process,
N clients spread over a few worker processes (threads inside), `--rounds` FedAvg rounds in
which every client downloads the model, adds a small delta and uploads it. Reported per
framework: seconds per round (from round start, all clients connected, to the published
aggregate), the server process's CPU per client update (its own CPU time from /proc or
process_time, apart from the clients' processes, over the job from the first client's
arrival to the last round), server peak resident memory (VmHWM) and bytes moved per
client per round. Targets: sporenet's server CPU per update at most half of Flower's at
every workload, and its peak memory flat in N.

Tiers (`--hierarchical`). The same devices (`--devices`, default 2,000, cheap threads of
the SDK's Client whose sessions share one event loop per process, a 10k-parameter model)
run `--rounds` rounds straight against one sporenet-server, then through `--edges`
sporenet-edge daemons (default 10) against another: the cloud's round time and CPU
seconds per round over the steady rounds (round 2 on: round 1 also holds start-up and
every registration), its peak memory, and the update bytes it received per round (its
sporenet_bytes_received_total metric); the edges' CPU too. Targets: with the edges, cloud
CPU and bytes in at most a tenth of the direct job's, round time at most 1.2x. Everything
shares this machine's cores, so the round time with edges also pays for the edges' CPU.

    python benchmarks/federated.py --quick                 # Flower comparison, < 1 minute
    python benchmarks/federated.py                         # N in {10,100,500}, P in {100k, 1m}
    python benchmarks/federated.py --clients 10,100 --params 1m --no-flower
    python benchmarks/federated.py --repeats 3             # medians: Flower varies run to run
    python benchmarks/federated.py --hierarchical --quick  # 200 devices, 4 edges, < 1 minute
    python benchmarks/federated.py --hierarchical          # 2,000 devices, 10 edges
    python benchmarks/federated.py --idle                  # server KB per connected client

Idle clients (`--idle`). A job whose round cannot start (min_clients one above the fleet),
`--idle-clients` SDK clients (default 500) connected and polling at the pace the server
asks for: the server's resident memory (VmRSS) with one client and with all of them, and
the KB each client beyond the first costs it (median of `--repeats` runs, five by
default, with their range, and the cost from half the clients to all). Then one more
client arrives and the round starts: the round start delay is the time from its
registration until every client of the round has the model. Each run also measures a
bare grpc.aio server the same way (grpc_floor.idle_floor): the gRPC floor under that
figure, per open connection, per connection holding a stream and per connection polling
every 0.5 s. Target: at most 20 KB.

Flower runs if `flwr` imports; install its pinned versions with
`pip install --no-deps -r benchmarks/requirements-flower.txt`. If it does not import, or
one of its jobs does not finish within `--flower-timeout` seconds, the benchmark says so
and reports sporenet alone. SPORENET_BENCH_PROFILE=DIR runs every sporenet-server and
sporenet-edge under cProfile (see _common.profile_main); SPORENET_BENCH_THREADS=1 prints
the server's CPU by thread. Timed subprocesses run without OPENBLAS_CORETYPE /
OPENBLAS_L2_SIZE; the BLAS kernel they load and each process's peak RSS are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    blas_kernels,
    clean_env,
    cpu_description,
    cpu_seconds,
    daemon_command,
    free_port,
    peak_mb,
    round_seconds,
    start_server,
    thread_cpu,
    timed_fedavg,
)

# Simulated local training time per client and round (both frameworks), via the environment
# so worker processes see it: SPORENET_BENCH_TRAIN_SECONDS.
TRAIN_SECONDS = float(os.environ.get("SPORENET_BENCH_TRAIN_SECONDS", "0"))
CLIENTS_PER_PROCESS = 90
DEVICES_PER_PROCESS = 200  # tiers: cheap devices, one event loop per process carries them
PARAMS = {"10k": (10, 1000), "100k": (100, 1000), "1m": (1000, 1000)}  # weight; + bias of rows
INSTALL_FLOWER = "pip install --no-deps -r benchmarks/requirements-flower.txt"
THREADS_ENV = "SPORENET_BENCH_THREADS"  # =1: print the server's CPU by thread
# =shared: sporenet clients keep one connection (the SDK's default, "separate", reconnects
# after each upload so the server's per-connection read buffers do not grow)
UPLOAD_CONNECTION_ENV = "SPORENET_BENCH_UPLOAD_CONNECTION"
UPLOAD_CHUNK_ENV = "SPORENET_BENCH_UPLOAD_CHUNK"  # bytes per upload message (the SDK's default)
CPU_TARGET = 0.5  # sporenet server CPU per update / Flower's
TIER_TARGETS = {"cloud CPU": 0.1, "bytes in": 0.1, "round time": 1.2}  # edges / direct


class FlowerUnavailable(RuntimeError):
    """The Flower side could not run (import failure, crash or timeout)."""


@dataclass
class Result:
    framework: str
    clients: int
    params: str
    rounds: int
    round_seconds: float
    peak_mb: float
    bytes_per_client: float | None
    server_cpu: float  # CPU seconds in the server process over the job
    client_cpu: float  # CPU seconds in all client processes over the job

    @property
    def cpu_per_update_ms(self) -> float:
        return 1e3 * self.server_cpu / (self.clients * self.rounds)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _initial_weights(params: str) -> dict[str, np.ndarray]:
    rows, cols = PARAMS[params]
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((rows, cols)).astype(np.float32) * 0.01,
        "b": np.zeros(rows, np.float32),
    }


def _write_spore(path: Path, params: str) -> None:
    import sporenet.lite
    from sporenet.lite import ModelBuilder, OpCode

    w0 = _initial_weights(params)
    b = ModelBuilder()
    x = b.input("x", (-1, w0["w"].shape[1]))
    b.output(b.op(OpCode.FULLY_CONNECTED, [x, b.constant("w", w0["w"]), b.constant("b", w0["b"])]))
    path.write_bytes(sporenet.lite.serialize(b.build()))


def _spawn_workers(
    kind: str,
    addresses: list[str],
    n: int,
    procs: int,
    params: str,
    per_process: int = CLIENTS_PER_PROCESS,
) -> list[subprocess.Popen[bytes]]:
    """Client worker processes for clients 0..n-1, at most `per_process` each; with several
    `addresses`, the clients are split evenly over them (a device group per edge)."""
    # More threads per process only add GIL contention; with
    # SPORENET_BENCH_FLOWER_SHARED_CONNECTION=1 Flower's clients of a process share one
    # HTTP/2 connection, whose 100-stream limit would stall them.
    workers = []
    groups, stop = len(addresses), 0
    for address, size in zip(addresses, _group_sizes(n, groups), strict=True):
        start, stop = stop, stop + size
        if size <= 0:
            continue
        group_procs = max(-(-procs // groups), -(-size // per_process))
        per = -(-size // group_procs)
        for first in range(start, stop, per):
            count = str(min(per, stop - first))
            cmd = [sys.executable, __file__, f"--{kind}-worker", address, str(first), count, params]
            # stderr to a file: an unread pipe could fill up and stall a chatty worker.
            log = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the process object)
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=clean_env())
            proc._log = log  # type: ignore[attr-defined]
            workers.append(proc)
    return workers


def _group_sizes(n: int, groups: int) -> list[int]:
    """How many of n clients each of `groups` groups holds (as even as can be)."""
    return [n // groups + (1 if g < n % groups else 0) for g in range(groups)]


def _log_tail(proc: subprocess.Popen[bytes]) -> str:
    log = getattr(proc, "_log", None)
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")[-2000:]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Kill whatever of `procs` still runs, and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)


def _wait_workers(workers: list[subprocess.Popen[bytes]], timeout: float, what: str) -> None:
    """Wait for every worker; on timeout or a failed worker, kill them all and raise."""
    end = time.monotonic() + timeout
    try:
        for w in workers:
            try:
                w.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"{what}: clients did not finish within {timeout:.0f} s"
                ) from None
            if w.returncode != 0:
                raise RuntimeError(
                    f"{what}: a client worker failed ({w.returncode}):\n{_log_tail(w)}"
                )
    finally:
        _stop(workers)


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _stop_server(server: subprocess.Popen[bytes]) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(120)  # under a profiler, writing the stats takes a while
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


# -- sporenet ------------------------------------------------------------------------------


def _start_cloud(
    model: Path,
    params: str,
    state: Path,
    log: Path,
    *,
    rounds: int,
    min_clients: int,
    extra: list[str] | None = None,
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Write the `params` model to `model` and start sporenet-server on it with a metrics
    port; returns the process, its port and its metrics port. `state` is a fresh dir per
    run: a finished job's state would make a repeat a no-op."""
    _write_spore(model, params)
    port, mport = free_port(), free_port()
    server = start_server(
        state,
        model,
        address=f"127.0.0.1:{port}",
        rounds=rounds,
        min_clients=min_clients,
        log=log,
        extra=["--metrics-port", str(mport), *(extra or [])],
        env=clean_env(),
        timeout=60,
    )
    return server, port, mport


def run_sporenet(
    n: int, params: str, rounds: int, procs: int, workdir: Path, extra: list[str] | None = None
) -> Result:
    log_path = workdir / f"sporenet-{n}-{params}.log"
    server, port, mport = _start_cloud(
        workdir / f"sporenet-{params}.spore",
        params,
        Path(tempfile.mkdtemp(prefix=f"state-{n}-{params}-", dir=workdir)),
        log_path,
        rounds=rounds,
        min_clients=n,
        extra=extra,
    )
    try:
        before, cpu0 = _children_cpu(), cpu_seconds(server.pid)
        workers = _spawn_workers("sporenet", [f"127.0.0.1:{port}"], n, procs, params)
        _wait_workers(workers, timeout=3600, what=f"sporenet {n} clients {params}")
        server_cpu = cpu_seconds(server.pid) - cpu0
        client_cpu = _children_cpu() - before
        peak = peak_mb(server.pid)
        if os.environ.get(THREADS_ENV):
            per_thread = sorted(thread_cpu(server.pid).items(), key=lambda kv: -sum(kv[1]))
            print(
                f"sporenet server threads, CPU s since start ({n} clients {params}): "
                + ", ".join(
                    f"{name} user {user:.2f} sys {system:.2f}"
                    for name, (user, system) in per_thread
                    if user + system > 0
                ),
                flush=True,
            )
        values = _metrics(mport)
    finally:
        _stop_server(server)
    moved = values["sporenet_bytes_sent_total"] + values["sporenet_bytes_received_total"]
    durations = round_seconds(log_path)
    return Result(
        "sporenet",
        n,
        params,
        rounds,
        float(np.mean(durations)),
        peak,
        moved / n / rounds,
        server_cpu,
        client_cpu,
    )


IDLE_REPEATS = 5  # --idle runs by default: the median of five
IDLE_SETTLE_SECONDS = 15.0  # longer than a held poll (long_poll, 10 s) and a poll's pause


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def idle_worker(address: str, count: int) -> None:
    """`count` clients that connect, register and long-poll until killed."""
    import logging

    from sporenet.federated import Client

    logging.basicConfig(level=os.environ.get("SPORENET_BENCH_CLIENT_LOG", "WARNING"))
    clients = [
        Client(address, train=lambda w, c: (w, 1, {}), name=f"idle-{os.getpid()}-{i}")
        for i in range(count)
    ]
    for c in clients:
        threading.Thread(target=c.run, daemon=True).start()
        time.sleep(0.002)  # a connection burst would measure the backlog, not the clients
    threading.Event().wait()


def idle_once(n: int, workdir: Path) -> tuple[float, float, float]:
    """Server memory (KB) per connected idle client: beyond the first, at `n` clients, and
    from `n` // 2 to `n` (the marginal cost: no start-up heap left to fill); then the
    round start delay (s) once client `n` + 1 arrives."""
    workdir.mkdir(parents=True, exist_ok=True)
    server, port, mport = _start_cloud(
        workdir / "idle.spore",
        "10k",
        workdir / "idle-state",
        workdir / "idle.log",
        rounds=1,
        min_clients=n + 1,  # starts only with one more client: every client stays idle
    )
    workers: list[subprocess.Popen[bytes]] = []

    def add_clients(k: int) -> None:
        cmd = [sys.executable, __file__, "--idle-worker", f"127.0.0.1:{port}", str(k)]
        workers.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=clean_env()))

    def wait_metric(name: str, at_least: float) -> float:
        end = time.monotonic() + 600
        while _metrics(mport)[name] < at_least:
            if time.monotonic() > end:
                raise TimeoutError(f"{name} stayed below {at_least}")
            time.sleep(0.05)
        return time.monotonic()

    try:
        rss: dict[int, int] = {}
        started = 0
        for count in (1, n // 2, n):
            add, started = count - started, count
            while add > 0:
                add_clients(min(CLIENTS_PER_PROCESS, add))
                add -= min(CLIENTS_PER_PROCESS, add)
            wait_metric("sporenet_clients_registered", count)
            # Registered is not yet idle: wait until every client polled (or its held poll
            # cycled) once more: its connection and poll state are then what an idle
            # client keeps.
            time.sleep(IDLE_SETTLE_SECONDS)
            rss[count] = _rss_kb(server.pid)
            print(f"{count:5d} idle clients: server RSS {rss[count] / 1024:.1f} MB", flush=True)
        add_clients(1)
        arrived = wait_metric("sporenet_clients_registered", n + 1)
        model_bytes = (workdir / "idle.spore").stat().st_size
        started_at = wait_metric("sporenet_bytes_sent_total", (n + 1) * model_bytes)
    finally:
        _stop(workers)
        _stop_server(server)
    per = (rss[n] - rss[1]) / (n - 1)
    return per, (rss[n] - rss[n // 2]) / (n - n // 2), started_at - arrived


def run_idle(args: argparse.Namespace, workdir: Path) -> None:
    """Server memory per connected idle client, sporenet's and a bare grpc.aio server's
    (grpc_floor.py) in the same run, alternating, and the round start delay: medians of
    `--repeats` runs."""
    from grpc_floor import idle_floor

    n = 100 if args.quick else args.idle_clients
    ours: list[float] = []
    marginal: list[float] = []
    delays: list[float] = []
    floor: list[dict[str, float]] = []
    for i in range(max(IDLE_REPEATS if args.repeats is None else args.repeats, 1)):
        first, last_half, delay = idle_once(n, workdir / f"idle-{i}")
        ours.append(first)
        marginal.append(last_half)
        delays.append(delay)
        floor.append(idle_floor(n, [("grpc.http2.bdp_probe", 0)]))
        print(
            f"run {i + 1}: sporenet {ours[-1]:.1f} KB per client ({marginal[-1]:.1f} from"
            f" {n // 2} to {n}), round start {delay:.2f} s; bare grpc.aio"
            f" {floor[-1]['connection']:.1f} KB per connection,"
            f" {floor[-1]['stream']:.1f} KB holding a stream, {floor[-1]['poll']:.1f} KB"
            f" polling every 0.5 s ({floor[-1]['stream-marginal']:.1f} and"
            f" {floor[-1]['poll-marginal']:.1f} from {n // 2} to {n})",
            flush=True,
        )
    per = float(np.median(ours))
    print(
        f"server memory per connected client beyond the first, at {n} clients (median of"
        f" {len(ours)}, runs {min(ours):.1f}-{max(ours):.1f}): {per:.1f} KB (target <= 20 KB:"
        f" {'met' if per <= 20 else 'not met'});"
        f" bare grpc.aio floor: {np.median([f['connection'] for f in floor]):.1f} KB per"
        f" connection, {np.median([f['stream'] for f in floor]):.1f} KB holding a stream,"
        f" {np.median([f['poll'] for f in floor]):.1f} KB polling;"
        f" from {n // 2} to {n} clients: sporenet {np.median(marginal):.1f} KB; round start"
        f" delay (last client registered -> all {n + 1} have the model):"
        f" {np.median(delays):.2f} s"
    )


def sporenet_worker(address: str, first: int, count: int, params: str) -> None:
    import logging

    from sporenet.federated import Client

    logging.basicConfig(level=os.environ.get("SPORENET_BENCH_CLIENT_LOG", "WARNING"))

    def make_train(i: int):  # type: ignore[no-untyped-def]
        def train(weights: dict[str, np.ndarray], config: dict) -> tuple:
            time.sleep(TRAIN_SECONDS)
            return {k: v + np.float32(0.001 * (i % 7)) for k, v in weights.items()}, i + 1, {}

        return train

    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            c = Client(
                address,
                train=make_train(i),
                name=f"c{i}",
                max_backoff=1.0,
                rpc_timeout=600,
                upload_connection=os.environ.get(UPLOAD_CONNECTION_ENV, "separate"),
                chunk_size=int(os.environ.get(UPLOAD_CHUNK_ENV, 512 << 10)),
            )
            if c.run() is None:
                raise RuntimeError("client stopped before the job finished")
            c.close()
        except BaseException as e:  # reported by the worker's exit code
            failures.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(first, first + count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"{len(failures)} clients failed: {failures[0]!r}")


# -- Flower --------------------------------------------------------------------------------


def flower_problem(timeout: float = 180.0) -> str | None:
    """Why the Flower side cannot run here (None if flwr and the modules the benchmark uses
    import), checked in a subprocess so a broken install cannot hang or break this one."""
    code = (
        "import flwr, flwr.server, flwr.client\n"
        "from flwr.compat.client.grpc_client import connection\n"
        "from flwr.common import ndarrays_to_parameters\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, timeout=timeout, env=clean_env()
        )
    except subprocess.TimeoutExpired:
        return f"importing flwr took more than {timeout:.0f} s"
    if out.returncode != 0:
        lines = out.stderr.decode(errors="replace").strip().splitlines()
        return f"flwr cannot be imported ({lines[-1] if lines else f'exit {out.returncode}'})"
    return None


def _wait_listening(port: int, server: subprocess.Popen[bytes], end: float, log: Path) -> None:
    """Until the Flower server accepts connections (it has no readiness signal)."""
    while True:
        if server.poll() is not None:
            raise FlowerUnavailable(
                f"the Flower server exited ({server.returncode}) before listening:\n"
                f"{log.read_text(errors='replace')[-2000:]}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > end:
            raise FlowerUnavailable("the Flower server did not start listening in time")
        time.sleep(0.1)


def run_flower(
    n: int, params: str, rounds: int, procs: int, workdir: Path, timeout: float
) -> Result:
    """One Flower job; FlowerUnavailable (everything stopped) if it fails or does not end
    within `timeout` seconds."""
    port = free_port()
    out = workdir / f"flower-{n}-{params}.json"
    log = workdir / f"flower-{n}-{params}.log"
    what = f"Flower {n} clients {params}"
    end = time.monotonic() + timeout
    command = [sys.executable, __file__, "--flower-server", f"127.0.0.1:{port}", str(n)]
    with open(log, "wb") as sink:
        server = subprocess.Popen(
            [*command, params, str(rounds), str(out)],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=clean_env(),
        )
    workers: list[subprocess.Popen[bytes]] = []
    try:
        _wait_listening(port, server, end, log)
        before = _children_cpu()
        workers = _spawn_workers("flower", [f"127.0.0.1:{port}"], n, procs, params)
        try:
            _wait_workers(workers, max(1.0, end - time.monotonic()), what)
            server.wait(max(1.0, end - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired):
            raise FlowerUnavailable(
                f"{what}: {rounds} rounds did not finish within {timeout:.0f} s (raise "
                f"--flower-timeout, or check the versions: {INSTALL_FLOWER}); server log:\n"
                f"{log.read_text(errors='replace')[-1500:]}"
            ) from None
        except RuntimeError as e:
            raise FlowerUnavailable(str(e)) from None
        client_cpu = _children_cpu() - before
    finally:
        _stop([*workers, server])
    if not out.exists():
        raise FlowerUnavailable(
            f"{what}: the server ended without a report:\n{log.read_text(errors='replace')[-2000:]}"
        )
    report = json.loads(out.read_text())
    return Result(
        "flower",
        n,
        params,
        rounds,
        float(np.mean(report["durations"])),
        report["peak_mb"],
        None,
        report["cpu"],
        client_cpu,
    )


def flower_server(address: str, n: int, params: str, rounds: int, out: str) -> None:
    import flwr as fl

    w0 = _initial_weights(params)
    strategy = timed_fedavg(n, [w0["w"], w0["b"]])
    cpu0 = time.process_time()  # from here on, as sporenet's: serving clients and rounds
    fl.server.start_server(
        server_address=address, config=fl.server.ServerConfig(num_rounds=rounds), strategy=strategy
    )
    report = {
        "durations": strategy.round_seconds(),
        "peak_mb": peak_mb(os.getpid()),
        "cpu": time.process_time() - cpu0,
    }
    Path(out).write_text(json.dumps(report))


def _flower_own_connections() -> None:
    """Give every Flower client its own connection, as every sporenet client (and every
    real device) has: by default gRPC lets the clients of one process share a single
    HTTP/2 connection, which would compare Flower over ~6 connections with sporenet over
    N. Same channel options as flwr's own create_channel, plus a local subchannel pool.
    """
    import grpc
    from flwr.compat.client.grpc_client import connection

    def create_channel(  # type: ignore[no-untyped-def]
        server_address,
        insecure,
        root_certificates=None,
        max_message_length=None,
        interceptors=None,
    ):
        if not insecure or interceptors:
            raise RuntimeError("the benchmark runs Flower on loopback without TLS/interceptors")
        size = max_message_length or 536_870_912
        return grpc.insecure_channel(
            server_address,
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )

    connection.create_channel = create_channel


def flower_worker(address: str, first: int, count: int, params: str) -> None:
    import flwr as fl

    if os.environ.get("SPORENET_BENCH_FLOWER_SHARED_CONNECTION") != "1":
        _flower_own_connections()

    class NumPyClient(fl.client.NumPyClient):  # type: ignore[misc]
        def __init__(self, i: int) -> None:
            self.i = i

        def get_parameters(self, config):  # type: ignore[no-untyped-def]
            w0 = _initial_weights(params)
            return [w0["w"], w0["b"]]

        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            time.sleep(TRAIN_SECONDS)
            return [p + np.float32(0.001 * (self.i % 7)) for p in parameters], self.i + 1, {}

    def run(i: int) -> None:
        fl.client.start_client(
            server_address=address, client=NumPyClient(i).to_client(), insecure=True
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(first, first + count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- tiers: devices through edges vs straight to the cloud ---------------------------------


@dataclass
class TierResult:
    mode: str
    devices: int
    rounds: int
    round_seconds: float  # median over the rounds after the first (connection set-up)
    cloud_cpu: float  # CPU seconds per round in the cloud server process (SteadyCpu)
    cloud_peak_mb: float
    cloud_bytes_in: float  # update bytes the cloud received over the job, per round
    edges_cpu: float = 0.0  # CPU seconds per round in all edge processes (SteadyCpu)


def edge_problem() -> str | None:
    """Why the edge tier cannot run (None if sporenet.federated.edge is there)."""
    try:
        found = importlib.util.find_spec("sporenet.federated.edge") is not None
    except ModuleNotFoundError as e:
        return f"edge tier not available ({e})"
    if not found:
        return "edge tier not available: sporenet.federated.edge is missing (sporenet-edge)"
    return None


def _steady_round_seconds(log: Path) -> float:
    durations = round_seconds(log)
    if not durations:
        return float("nan")
    return float(np.median(durations[1:] if len(durations) > 2 else durations))


def _write_edge_config(path: Path, devices: int) -> None:
    """The edge's own round settings: all of its devices in each of its rounds, and the
    same lax timing as the cloud (start_server), so a busy machine drops nobody."""
    path.write_text(
        f"min_clients = {devices}\n"
        "round_timeout = 3600.0\n"
        "heartbeat_interval = 30.0\n"
        "heartbeat_timeout = 900.0\n"
    )


def _start_edge(
    upstream: str, address: str, state: Path, config: Path, log: Path
) -> subprocess.Popen[bytes]:
    command = [
        *daemon_command("sporenet.federated.edge", f"edge-{state.name}"),
        "--upstream",
        upstream,
        "--address",
        address,
        "--state-dir",
        str(state),
        "--config",
        str(config),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, env=clean_env())
    proc._log_path = log  # type: ignore[attr-defined]
    return proc


def _wait_edges(procs: list[subprocess.Popen[bytes]], addresses: list[str], timeout: float) -> None:
    """Until every edge accepts connections (an edge may open its port only once the
    cloud's first task arrives, which needs all edges registered: so all are started
    before this waits); RuntimeError with the log of an edge that exits or stays closed."""
    end = time.monotonic() + timeout
    for proc, address in zip(procs, addresses, strict=True):
        host, port = address.rsplit(":", 1)
        log: Path = proc._log_path  # type: ignore[attr-defined]
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"sporenet-edge exited ({proc.returncode}):\n{log.read_text()[-2000:]}"
                )
            with socket.socket() as s:
                if s.connect_ex((host, int(port))) == 0:
                    break
            if time.monotonic() > end:
                raise RuntimeError(
                    f"sporenet-edge at {address} did not open its port within {timeout:.0f} s:"
                    f"\n{log.read_text()[-2000:]}"
                )
            time.sleep(0.05)


class SteadyCpu:
    """CPU seconds of the cloud and of the edges over the steady rounds: from the start
    of round 2's fit phase to the last round's publication, read from the cloud's JSON
    log as it is written (round 1 also holds start-up and every registration)."""

    def __init__(self, log: Path, cloud: int, edges: list[int], rounds: int) -> None:
        self.log, self.cloud, self.edges, self.rounds = log, cloud, edges, rounds
        self.marks: dict[str, tuple[float, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _snapshot(self) -> tuple[float, float]:
        return cpu_seconds(self.cloud), sum(cpu_seconds(pid) for pid in self.edges)

    def _watch(self) -> None:
        first = 2 if self.rounds >= 2 else 1
        with open(self.log, "rb") as f:
            pending = b""
            while not self._stop.is_set() and len(self.marks) < 2:
                chunk = f.read()
                if not chunk:
                    self._stop.wait(0.01)
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    event, rnd = e.get("event"), e.get("round")
                    if event == "phase_started" and e.get("phase") == "fit" and rnd == first:
                        self.marks.setdefault("start", self._snapshot())
                    elif event == "round_published" and rnd == self.rounds:
                        self.marks.setdefault("end", self._snapshot())

    def per_round(self) -> tuple[float, float]:
        """(cloud, edges) CPU seconds per steady round; NaN if the log lacked the marks."""
        self._stop.set()
        self._thread.join(5)
        if "start" not in self.marks or "end" not in self.marks:
            return float("nan"), float("nan")
        n = self.rounds - 1 if self.rounds >= 2 else 1
        (c0, e0), (c1, e1) = self.marks["start"], self.marks["end"]
        return (c1 - c0) / n, (e1 - e0) / n


def run_tier(
    devices: int, edges: int, params: str, rounds: int, workdir: Path, timeout: float
) -> TierResult:
    """One job of `devices` devices, straight to the cloud (edges=0) or through `edges`
    sporenet-edge daemons."""
    mode = "direct" if edges == 0 else f"{edges} edges"
    tag = f"tier-{edges}"
    cloud_log = workdir / f"{tag}-cloud.log"
    cloud, port, mport = _start_cloud(
        workdir / f"tier-{params}.spore",
        params,
        Path(tempfile.mkdtemp(prefix=f"{tag}-cloud-", dir=workdir)),
        cloud_log,
        rounds=rounds,
        min_clients=edges or devices,
    )
    edge_procs: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []
    try:
        addresses = [f"127.0.0.1:{port}"]
        if edges:
            addresses = [f"127.0.0.1:{free_port()}" for _ in range(edges)]
            for k, (address, size) in enumerate(
                zip(addresses, _group_sizes(devices, edges), strict=True)
            ):
                config = workdir / f"{tag}-edge{k}.toml"
                _write_edge_config(config, size)
                edge_state = Path(tempfile.mkdtemp(prefix=f"{tag}-edge{k}-", dir=workdir))
                edge_log = workdir / f"{tag}-edge{k}.log"
                edge_procs.append(
                    _start_edge(f"127.0.0.1:{port}", address, edge_state, config, edge_log)
                )
        steady = SteadyCpu(cloud_log, cloud.pid, [e.pid for e in edge_procs], rounds)
        # Devices start at once and retry until their edge listens (an edge opens its port
        # once the cloud's first task arrived); an edge that fails stops the run.
        workers = _spawn_workers(
            "sporenet", addresses, devices, len(addresses), params, DEVICES_PER_PROCESS
        )
        if edge_procs:
            _wait_edges(edge_procs, addresses, timeout=120)
        _wait_workers(workers, timeout=timeout, what=f"{devices} devices, {mode}")
        cloud_cpu, edges_cpu = steady.per_round()
        peak = peak_mb(cloud.pid)
        values = _metrics(mport)
    finally:
        _stop(workers)  # whatever went wrong, no device outlives its job
        for e in edge_procs:
            _stop_server(e)
        _stop_server(cloud)
    return TierResult(
        mode,
        devices,
        rounds,
        _steady_round_seconds(cloud_log),
        cloud_cpu,
        peak,
        values["sporenet_bytes_received_total"] / rounds,
        edges_cpu,
    )


# -- driver --------------------------------------------------------------------------------


def _verdict(value: float, target: float) -> str:
    if not np.isfinite(value):
        return "not measured"
    return "met" if value <= target else "NOT met"


def _table(results: list[Result]) -> str:
    head = (
        f"{'framework':<10} {'clients':>7} {'params':>6} {'s/round':>9} {'peak MB':>9} "
        f"{'MB/client/rd':>12} {'server CPU s':>12} {'ms/update':>10} {'client CPU s':>12}"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        per = f"{r.bytes_per_client / 1e6:.2f}" if r.bytes_per_client is not None else "n/a"
        rows.append(
            f"{r.framework:<10} {r.clients:>7} {r.params:>6} {r.round_seconds:>9.2f} "
            f"{r.peak_mb:>9.1f} {per:>12} {r.server_cpu:>12.2f} {r.cpu_per_update_ms:>10.2f} "
            f"{r.client_cpu:>12.2f}"
        )
    return "\n".join(rows)


def _median(results: list[Result], fw: str, n: int, params: str, key: str) -> float:
    runs = [r for r in results if (r.framework, r.clients, r.params) == (fw, n, params)]
    return float(np.median([getattr(r, key) for r in runs])) if runs else float("nan")


def _summary(results: list[Result]) -> str:
    """Per workload, medians over the repeats: seconds per round, server CPU per client
    update and its ratio to Flower's against the target, server peak memory."""
    head = (
        f"{'clients':>7} {'params':>6} {'sporenet s/rd':>13} {'flower s/rd':>11} "
        f"{'sporenet ms/upd':>15} {'flower ms/upd':>13} {'CPU ratio':>9} "
        f"{'target <= ' + str(CPU_TARGET):>14} {'sporenet MB':>11} {'flower MB':>9}"
    )
    rows = [head, "-" * len(head)]
    for n, params in dict.fromkeys((r.clients, r.params) for r in results):
        m = {
            (fw, key): _median(results, fw, n, params, key)
            for fw in ("sporenet", "flower")
            for key in ("round_seconds", "cpu_per_update_ms", "peak_mb")
        }
        ratio = m["sporenet", "cpu_per_update_ms"] / m["flower", "cpu_per_update_ms"]
        rows.append(
            f"{n:>7} {params:>6} {m['sporenet', 'round_seconds']:>13.2f} "
            f"{m['flower', 'round_seconds']:>11.2f} {m['sporenet', 'cpu_per_update_ms']:>15.2f} "
            f"{m['flower', 'cpu_per_update_ms']:>13.2f} {ratio:>9.2f} "
            f"{_verdict(ratio, CPU_TARGET):>14} {m['sporenet', 'peak_mb']:>11.1f} "
            f"{m['flower', 'peak_mb']:>9.1f}"
        )
    for params in dict.fromkeys(r.params for r in results):
        for fw in ("sporenet", "flower"):
            peaks = {
                n: _median(results, fw, n, params, "peak_mb")
                for n in sorted({r.clients for r in results if r.params == params})
            }
            peaks = {n: v for n, v in peaks.items() if np.isfinite(v)}
            if len(peaks) > 1:
                low, high = min(peaks), max(peaks)
                rows.append(
                    f"{fw} server peak RSS, {params}: "
                    + ", ".join(f"{n} clients {v:.0f} MB" for n, v in peaks.items())
                    + f" ({high}/{low} clients: x{peaks[high] / peaks[low]:.2f})"
                )
    return "\n".join(rows)


def _tier_report(results: list[TierResult], problem: str | None) -> str:
    head = (
        f"{'mode':<10} {'devices':>7} {'s/round':>8} {'cloud CPU s/rd':>14} "
        f"{'cloud peak MB':>13} {'cloud MB in/rd':>14} {'edges CPU s/rd':>14}"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(
            f"{r.mode:<10} {r.devices:>7} {r.round_seconds:>8.2f} {r.cloud_cpu:>14.2f} "
            f"{r.cloud_peak_mb:>13.1f} {r.cloud_bytes_in / 1e6:>14.2f} {r.edges_cpu:>14.2f}"
        )
    direct = [r for r in results if r.mode == "direct"]
    tiered = [r for r in results if r.mode != "direct"]
    if problem:
        rows.append(problem + ("" if tiered else ": hierarchical figures not measured"))
    if not direct or not tiered:
        return "\n".join(rows)

    def median(runs: list[TierResult], key: str) -> float:
        return float(np.median([getattr(r, key) for r in runs]))

    keys = {"cloud CPU": "cloud_cpu", "bytes in": "cloud_bytes_in", "round time": "round_seconds"}
    runs = f" (medians of {len(direct)} and {len(tiered)} runs)" if len(results) > 2 else ""
    rows.append(f"edges / direct{runs}:")
    for name, target in TIER_TARGETS.items():
        ratio = median(tiered, keys[name]) / median(direct, keys[name])
        rows.append(
            f"  {name + ':':<12} {ratio:>6.3f}  target <= {target:<4} {_verdict(ratio, target)}"
        )
    return "\n".join(rows)


def run_tiers(args: argparse.Namespace, workdir: Path) -> None:
    devices, edges = (200, 4) if args.quick else (args.devices, args.edges)
    params = "10k"
    rounds = 3 if args.quick else args.rounds
    print(
        f"tiers: {devices} devices, {PARAMS[params][0] * (PARAMS[params][1] + 1)} parameters, "
        f"{rounds} rounds, straight to the cloud and through {edges} edges",
        flush=True,
    )
    results: list[TierResult] = []
    problem = edge_problem()
    for _ in range(max(args.repeats or 1, 1)):  # alternating: the machine's load drifts
        for k in (0, edges) if problem is None else (0,):
            try:
                results.append(run_tier(devices, k, params, rounds, workdir, args.tier_timeout))
            except (RuntimeError, TimeoutError) as e:
                problem = f"{'direct' if k == 0 else f'{k} edges'} job failed: {e}"
                print(problem, flush=True)
                continue
            print(_tier_report(results[-1:], None).splitlines()[-1], flush=True)
    print()
    print(_tier_report(results, problem))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--sporenet-worker", "--flower-worker"):
        address, first, count, params = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        (sporenet_worker if sys.argv[1] == "--sporenet-worker" else flower_worker)(
            address, first, count, params
        )
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--idle-worker":
        idle_worker(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--flower-server":
        flower_server(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
        return
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a small run: well under a minute")
    p.add_argument("--clients", default="10,100,500")
    p.add_argument("--params", default="100k,1m", help="comma list of 10k, 100k, 1m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--procs", type=int, default=2, help="client worker processes")
    p.add_argument("--no-flower", action="store_true")
    p.add_argument(
        "--flower-timeout", type=float, default=600.0, help="seconds a whole Flower job may take"
    )
    p.add_argument("--server-args", default="", help="extra sporenet-server flags, space separated")
    p.add_argument(
        "--repeats",
        type=int,
        help="runs of each workload, alternating the frameworks; the summary gives medians"
        f" (default 1; --idle: {IDLE_REPEATS}, its figure moves by a few KB run to run)",
    )
    p.add_argument("--hierarchical", action="store_true", help="devices via edges vs direct")
    p.add_argument("--devices", type=int, default=2000, help="--hierarchical: devices")
    p.add_argument("--edges", type=int, default=10, help="--hierarchical: edges")
    p.add_argument(
        "--tier-timeout", type=float, default=3600.0, help="seconds a whole tier job may take"
    )
    p.add_argument("--idle", action="store_true", help="server memory per idle client")
    p.add_argument("--idle-clients", type=int, default=500, help="--idle: clients")
    args = p.parse_args()
    print(f"CPU: {cpu_description()}")
    print(f"BLAS in the timed subprocesses: {blas_kernels()}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sporenet-bench-") as tmp:
        if args.idle:
            run_idle(args, Path(tmp))
        elif args.hierarchical:
            run_tiers(args, Path(tmp))
        else:
            compare_flower(args, Path(tmp))
    print(
        f"peak RSS: this driver {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
        f" MB, largest child {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f}"
        f" MB; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


def compare_flower(args: argparse.Namespace, workdir: Path) -> None:
    clients = [10, 20] if args.quick else [int(c) for c in args.clients.split(",")]
    sizes = ["100k"] if args.quick else args.params.lower().split(",")
    rounds = 2 if args.quick else args.rounds
    flower_off = "not requested (--no-flower)" if args.no_flower else flower_problem()
    if flower_off and not args.no_flower:
        print(f"Flower side skipped: {flower_off}; install its pinned versions: {INSTALL_FLOWER}")
    results: list[Result] = []
    failures: list[str] = []
    for params in sizes:
        for n in clients:
            for _ in range(max(args.repeats or 1, 1)):
                extra = args.server_args.split()
                results.append(run_sporenet(n, params, rounds, args.procs, workdir, extra))
                print(_table(results[-1:]).splitlines()[-1], flush=True)
                if flower_off:
                    continue
                try:
                    results.append(
                        run_flower(n, params, rounds, args.procs, workdir, args.flower_timeout)
                    )
                    print(_table(results[-1:]).splitlines()[-1], flush=True)
                except FlowerUnavailable as e:  # report, and carry on with the others
                    failures.append(f"{n} clients {params}: {str(e).splitlines()[0]}")
                    print(f"Flower FAILED, {e}", flush=True)
    print()
    print(_table(results))
    print()
    print(_summary(results))
    for f in failures:
        print(f"Flower failed at {f}")


if __name__ == "__main__":
    main()
