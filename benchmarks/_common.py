"""Helpers shared by the benchmark scripts: the machine header (CPU model, SIMD features
and BLAS kernel every script prints), free ports, the BLAS-clean environment, the
sporenet-server daemon started and read the same way by every federated benchmark (and,
with SPORENET_BENCH_PROFILE=DIR, under cProfile in every thread), a process's CPU time
and peak memory from /proc, and the SQNR of a quantized result.

The scripts run as `python benchmarks/NAME.py`, so this module is imported as `_common`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    """This run's environment without the BLAS overrides (timed subprocesses use the CPU's
    own kernels)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


PROFILE_ENV = "SPORENET_BENCH_PROFILE"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, tuple[float, float]]:
    """(user, system) CPU seconds of a live process's threads so far, summed by thread
    name (a name ending in digits counts with its pool: "rpc_3" as "rpc_")."""
    out: dict[str, tuple[float, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip().rstrip("0123456789")
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        user, system = out.get(name, (0.0, 0.0))
        out[name] = (user + int(fields[11]) / tick, system + int(fields[12]) / tick)
    return out


def peak_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def blas_kernels() -> str:
    """The BLAS libraries and kernels NumPy loads in a timed subprocess (clean_env), as
    threadpoolctl reports them."""
    code = (
        "import numpy, json\n"
        "from threadpoolctl import threadpool_info\n"
        "print(json.dumps([(i.get('internal_api'), i.get('version'), i.get('architecture'),"
        " i.get('num_threads')) for i in threadpool_info() if i.get('user_api') == 'blas']))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], env=clean_env(), capture_output=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        return "unknown (threadpoolctl timed out)"
    if out.returncode != 0:
        return "unknown (threadpoolctl missing: pip install threadpoolctl)"
    rows = json.loads(out.stdout)
    return ", ".join(f"{api} {ver} kernel {arch} ({n} threads)" for api, ver, arch, n in rows)


# The /proc/cpuinfo flags that decide which int8 and float kernels a runtime picks
# (x86-64 "flags", aarch64 "Features"): the figures are only comparable between
# machines that share them.
SIMD_FLAGS = re.compile(
    r"sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*"  # x86-64
    r"|neon|asimd\w*|sve\w*|i8mm|bf16|dotprod"  # aarch64
)


def cpu_description() -> str:
    """The CPU model, core count and SIMD features of this machine (from /proc/cpuinfo;
    platform.processor() where there is none), saying when AVX-512 or VNNI is absent."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "Hardware") and value.strip():
            model = value.strip()
        elif key in ("flags", "Features"):
            flags.update(f for f in value.split() if SIMD_FLAGS.fullmatch(f))
    simd = " ".join(sorted(flags)) or "unknown"
    if platform.machine() in ("x86_64", "AMD64") and flags:
        missing = [
            name
            for name, present in (
                ("AVX-512", any(f.startswith("avx512") for f in flags)),
                ("VNNI", any("vnni" in f for f in flags)),
            )
            if not present
        ]
        if missing:
            simd += f" (no {', no '.join(missing)})"
    return f"{model}, {os.cpu_count()} cores, {platform.machine()}; SIMD: {simd}"


def loaded_blas() -> str:
    """The BLAS libraries and kernels loaded in this process, as threadpoolctl reports them."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl missing: pip install threadpoolctl)"
    rows = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return (
        ", ".join(
            f"{i.get('internal_api')} {i.get('version')} kernel {i.get('architecture')}"
            f" ({i.get('num_threads')} threads)"
            for i in rows
        )
        or "none loaded"
    )


def machine_header(blas: str | None = None) -> str:
    """The lines a benchmark prints before its figures: the CPU model and SIMD features,
    and the BLAS kernel (`blas` when the script read it, else the one of this process)."""
    return f"CPU: {cpu_description()}\nBLAS: {blas if blas is not None else loaded_blas()}"


def module_command(module: str, profile_out: Path | None = None) -> list[str]:
    """`python -m module`, or, with `profile_out`, the same under cProfile in every thread
    (see profile_main), its merged stats written to `profile_out` when the process exits."""
    if profile_out is None:
        return [sys.executable, "-m", module]
    return [sys.executable, __file__, "--profile", str(profile_out), module]


def daemon_command(module: str, name: str) -> list[str]:
    """`module_command` for a daemon: under cProfile, its stats in $SPORENET_BENCH_PROFILE
    as `name`.prof, when that variable names a directory."""
    profile = os.environ.get(PROFILE_ENV)
    return module_command(module, Path(profile) / f"{name}.prof" if profile else None)


def profile_main(out: Path, module: str, argv: list[str]) -> None:
    """Run `module` as __main__ with a cProfile profiler in each Python thread (a server
    works on its event-loop and pool threads, which a plain `python -m cProfile` misses),
    timed by each thread's own CPU clock (waiting costs nothing);
    on exit, the merged stats go to `out` (pstats format) and the top functions by own
    time to `out`.txt."""
    import cProfile
    import pstats
    import runpy
    import threading

    profiles: list[cProfile.Profile] = []
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    profiles.append(main)
    sys.argv = [module, *argv]
    main.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        main.disable()
        stats = pstats.Stats(profiles[0])
        for prof in profiles[1:]:
            try:
                stats.add(prof)
            except (TypeError, ValueError):  # a thread that never ran a Python call
                continue
        stats.dump_stats(out)
        with open(f"{out}.txt", "w") as text:
            pstats.Stats(str(out), stream=text).sort_stats("tottime").print_stats(40)


def start_server(
    state: Path,
    model: Path,
    *,
    address: str,
    rounds: int,
    min_clients: int,
    log: Path,
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.Popen[bytes]:
    """Start sporenet-server on `address` and return once it wrote state/server.json.

    Rounds never time out and heartbeats are lax, so a slow, busy machine measures the
    protocol, not dropped clients; the server keeps serving after the job (the caller
    stops it). `extra` is appended to the command line. With
    SPORENET_BENCH_PROFILE=DIR the server runs under cProfile (profile_main) and leaves
    DIR/server-STATE.prof(.txt) when it stops. Raises
    RuntimeError with the log's tail (and stops the process) if the server does not come up.
    """
    command = [
        *daemon_command("sporenet.federated.server", f"server-{state.name}"),
        "--address",
        address,
        "--state-dir",
        str(state),
        "--model",
        str(model),
        "--rounds",
        str(rounds),
        "--min-clients",
        str(min_clients),
        "--round-timeout",
        "3600",
        "--heartbeat-interval",
        "30",
        "--heartbeat-timeout",
        "900",
        # The benchmarks read the server's CPU, memory and /metrics after the job.
        "--keep-serving",
        *extra,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=out, env=None if env is None else dict(env)
        )
    end = time.monotonic() + timeout
    while not (state / "server.json").exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"sporenet-server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc


def round_seconds(log: Path) -> list[float]:
    """Seconds from each round's fit phase start to its publication, from the server's
    JSON-lines log, in round order."""
    starts, ends = {}, {}
    for line in log.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("event") == "phase_started" and e.get("phase") == "fit":
            starts[e["round"]] = e["ts"]
        elif e.get("event") == "round_published":
            ends[e["round"]] = e["ts"]
    return [ends[r] - starts[r] for r in sorted(ends) if r in starts]


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio of `got` against `ref`, in dB (inf if equal).

    NumPy is imported here, not at module level: benchmarks choose the OpenBLAS kernels
    before NumPy loads.
    """
    import numpy as np

    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise))


def timed_fedavg(clients: int, initial: Sequence[np.ndarray]) -> Any:
    """Flower's FedAvg training every one of `clients` each round (no evaluation) from the
    `initial` weights; its round_seconds() gives each round's time from fit start (after
    sampling: all clients connected) to aggregation, in round order. Flower is imported
    here: it is an optional peer of the comparison."""
    import flwr as fl
    from flwr.common import ndarrays_to_parameters

    class TimedFedAvg(fl.server.strategy.FedAvg):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(
                fraction_fit=1.0,
                fraction_evaluate=0.0,
                min_fit_clients=clients,
                min_evaluate_clients=0,
                min_available_clients=clients,
                initial_parameters=ndarrays_to_parameters(list(initial)),
            )
            self.starts: dict[int, float] = {}
            self.ends: dict[int, float] = {}

        def configure_fit(self, server_round, parameters, client_manager):  # type: ignore[no-untyped-def]
            plan = super().configure_fit(server_round, parameters, client_manager)
            self.starts[server_round] = time.time()
            return plan

        def aggregate_fit(self, server_round, results, failures):  # type: ignore[no-untyped-def]
            agg = super().aggregate_fit(server_round, results, failures)
            self.ends[server_round] = time.time()
            return agg

        def round_seconds(self) -> list[float]:
            return [self.ends[r] - self.starts[r] for r in sorted(self.ends)]

    return TimedFedAvg()


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[1] == "--profile":
    profile_main(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
