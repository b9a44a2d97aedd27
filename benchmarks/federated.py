"""Federated round benchmark: sporenet-server vs Flower's FedAvg on the same loopback workload.

For each number of clients N and model size P: one server process, N clients spread over
a few worker processes (threads inside), `--rounds` FedAvg rounds in which every client
downloads the model, adds a small delta and uploads it. Reported per framework:
seconds per round (from round start, all clients connected, to the published aggregate),
server peak resident memory (VmHWM) and bytes moved per client per round.

    python benchmarks/federated.py --quick           # < 1 minute
    python benchmarks/federated.py                   # N in {10,100,500}, P in {100k, 1M}
    python benchmarks/federated.py --clients 10,100 --params 1m --no-flower
    python benchmarks/federated.py --repeats 3      # medians: Flower's times vary run to run

Flower runs only if `flwr` is importable (`pip install sporenet[bench]`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import free_port, round_seconds, start_server, timed_fedavg

# Simulated local training time per client and round (both frameworks), via the environment
# so worker processes see it: SPORENET_BENCH_TRAIN_SECONDS.
TRAIN_SECONDS = float(os.environ.get("SPORENET_BENCH_TRAIN_SECONDS", "0"))
CLIENTS_PER_PROCESS = 90
PARAMS = {"100k": (100, 1000), "1m": (1000, 1000)}  # weight shape; a bias of `rows` is added


@dataclass
class Result:
    framework: str
    clients: int
    params: str
    round_seconds: float
    peak_mb: float
    bytes_per_client: float | None
    server_cpu: float = float("nan")  # CPU seconds per round in the server process
    client_cpu: float = float("nan")  # CPU seconds per round in all client processes


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _peak_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
    kind: str, address: str, n: int, procs: int, params: str
) -> list[subprocess.Popen[bytes]]:
    # At most CLIENTS_PER_PROCESS clients per process (more threads per process only add
    # GIL contention; with SPORENET_BENCH_FLOWER_SHARED_CONNECTION=1 Flower's clients of a
    # process share one HTTP/2 connection, whose 100-stream limit would stall them).
    procs = max(procs, -(-n // CLIENTS_PER_PROCESS))
    per = -(-n // procs)
    workers = []
    for first in range(0, n, per):
        count = min(per, n - first)
        cmd = [
            sys.executable,
            __file__,
            f"--{kind}-worker",
            address,
            str(first),
            str(count),
            params,
        ]
        # stderr to a file: an unread pipe could fill up and stall a chatty worker.
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the process object)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        proc._log = log  # type: ignore[attr-defined]
        workers.append(proc)
    return workers


def _wait_workers(workers: list[subprocess.Popen[bytes]], timeout: float) -> None:
    end = time.monotonic() + timeout
    for w in workers:
        try:
            w.wait(max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()
            raise RuntimeError("clients did not finish in time") from None
        if w.returncode != 0:
            log = getattr(w, "_log", None)
            err = ""
            if log is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
            raise RuntimeError(f"a client worker failed ({w.returncode}):\n{err[-2000:]}")


# -- sporenet ------------------------------------------------------------------------------


def run_sporenet(
    n: int, params: str, rounds: int, procs: int, workdir: Path, extra: list[str] | None = None
) -> Result:
    model = workdir / f"sporenet-{params}.spore"
    _write_spore(model, params)
    # A state dir of its own per run: a finished job's state would make a repeat a no-op.
    state = Path(tempfile.mkdtemp(prefix=f"state-{n}-{params}-", dir=workdir))
    port, mport = free_port(), free_port()
    log_path = workdir / f"sporenet-{n}-{params}.log"
    server = start_server(
        state,
        model,
        address=f"127.0.0.1:{port}",
        rounds=rounds,
        min_clients=n,
        log=log_path,
        extra=["--metrics-port", str(mport), *(extra or [])],
        timeout=30,
    )
    try:
        before = _children_cpu()
        workers = _spawn_workers("sporenet", f"127.0.0.1:{port}", n, procs, params)
        _wait_workers(workers, timeout=3600)
        client_cpu = _children_cpu() - before
        peak, server_cpu = _peak_mb(server.pid), _cpu_seconds(server.pid)
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line and not line.startswith("#")
    }
    moved = values["sporenet_bytes_sent_total"] + values["sporenet_bytes_received_total"]
    durations = round_seconds(log_path)
    return Result(
        "sporenet",
        n,
        params,
        float(np.mean(durations)),
        peak,
        moved / n / rounds,
        server_cpu / rounds,
        client_cpu / rounds,
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
                poll_wait=2.0,
                max_backoff=1.0,
                rpc_timeout=600,
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


def run_flower(n: int, params: str, rounds: int, procs: int, workdir: Path) -> Result:
    port = free_port()
    out = workdir / f"flower-{n}-{params}.json"
    server = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--flower-server",
            f"127.0.0.1:{port}",
            str(n),
            params,
            str(rounds),
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(2.0)  # Flower's legacy server has no readiness signal; clients retry anyway
    before = _children_cpu()
    workers = _spawn_workers("flower", f"127.0.0.1:{port}", n, procs, params)
    _wait_workers(workers, timeout=900)
    client_cpu = _children_cpu() - before
    server.wait(600)
    if not out.exists():
        err = server.stderr.read().decode(errors="replace") if server.stderr else ""
        raise RuntimeError(f"Flower server failed:\n{err[-2000:]}")
    report = json.loads(out.read_text())
    return Result(
        "flower",
        n,
        params,
        float(np.mean(report["durations"])),
        report["peak_mb"],
        None,
        report["cpu"] / rounds,
        client_cpu / rounds,
    )


def flower_server(address: str, n: int, params: str, rounds: int, out: str) -> None:
    import flwr as fl

    w0 = _initial_weights(params)
    strategy = timed_fedavg(n, [w0["w"], w0["b"]])
    fl.server.start_server(
        server_address=address, config=fl.server.ServerConfig(num_rounds=rounds), strategy=strategy
    )
    durations = strategy.round_seconds()
    report = {
        "durations": durations,
        "peak_mb": _peak_mb(os.getpid()),
        "cpu": _cpu_seconds(os.getpid()),
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


# -- driver --------------------------------------------------------------------------------


def _table(results: list[Result]) -> str:
    head = (
        f"{'framework':<10} {'clients':>7} {'params':>6} {'s/round':>9} {'peak MB':>9} "
        f"{'MB/client/round':>16} {'server CPU s/rd':>16} {'client CPU s/rd':>16}"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        per = f"{r.bytes_per_client / 1e6:.2f}" if r.bytes_per_client is not None else "n/a"
        rows.append(
            f"{r.framework:<10} {r.clients:>7} {r.params:>6} {r.round_seconds:>9.2f} "
            f"{r.peak_mb:>9.1f} {per:>16} {r.server_cpu:>16.2f} {r.client_cpu:>16.2f}"
        )
    return "\n".join(rows)


def _summary(results: list[Result]) -> str:
    """Per workload: each framework's median s/round (and range) over the repeats, its
    median peak memory, and Flower's median over sporenet's (above 1: sporenet faster)."""
    rows = [
        f"{'clients':>7} {'params':>6} {'sporenet s/rd (range)':>24} {'flower s/rd (range)':>24} "
        f"{'flower/sporenet':>16} {'sporenet MB':>12} {'flower MB':>10}"
    ]
    rows.append("-" * len(rows[0]))
    workloads = dict.fromkeys((r.clients, r.params) for r in results)
    for n, params in workloads:
        cell, median = {}, {}
        for fw in ("sporenet", "flower"):
            runs = [r for r in results if (r.framework, r.clients, r.params) == (fw, n, params)]
            if not runs:
                cell[fw], median[fw] = ("n/a", "n/a"), float("nan")
                continue
            times = [r.round_seconds for r in runs]
            median[fw] = float(np.median(times))
            cell[fw] = (
                f"{median[fw]:.2f} ({min(times):.2f}-{max(times):.2f})",
                f"{np.median([r.peak_mb for r in runs]):.1f}",
            )
        rows.append(
            f"{n:>7} {params:>6} {cell['sporenet'][0]:>24} {cell['flower'][0]:>24} "
            f"{median['flower'] / median['sporenet']:>16.2f} {cell['sporenet'][1]:>12} "
            f"{cell['flower'][1]:>10}"
        )
    return "\n".join(rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--sporenet-worker", "--flower-worker"):
        address, first, count, params = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        (sporenet_worker if sys.argv[1] == "--sporenet-worker" else flower_worker)(
            address, first, count, params
        )
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--flower-server":
        flower_server(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6])
        return
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="10 and 20 clients, 100k params, 2 rounds")
    p.add_argument("--clients", default="10,100,500")
    p.add_argument("--params", default="100k,1m", help="comma list of 100k, 1m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--procs", type=int, default=2, help="client worker processes")
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--server-args", default="", help="extra sporenet-server flags, space separated")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each workload, alternating the frameworks; the summary gives medians",
    )
    args = p.parse_args()
    clients = [10, 20] if args.quick else [int(c) for c in args.clients.split(",")]
    sizes = ["100k"] if args.quick else args.params.lower().split(",")
    rounds = 2 if args.quick else args.rounds
    flower = not args.no_flower and importlib.util.find_spec("flwr") is not None
    if not args.no_flower and not flower:
        print("flwr is not installed: Flower comparison skipped (pip install sporenet[bench])")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="sporenet-bench-") as tmp:
        for params in sizes:
            for n in clients:
                for _ in range(max(args.repeats, 1)):
                    extra = args.server_args.split()
                    results.append(run_sporenet(n, params, rounds, args.procs, Path(tmp), extra))
                    print(_table(results[-1:]).splitlines()[-1], flush=True)
                    if flower:
                        try:
                            results.append(run_flower(n, params, rounds, args.procs, Path(tmp)))
                            print(_table(results[-1:]).splitlines()[-1], flush=True)
                        except Exception as e:  # report and carry on with the other workloads
                            print(f"flower {n} clients {params}: failed: {e}", flush=True)
    print()
    print(_table(results))
    print()
    print(_summary(results))


if __name__ == "__main__":
    main()
