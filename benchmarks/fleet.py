"""Fleet benchmark: sporenet's fleet simulator against Flower's simulation engine (Ray),
non-IID FedAvg against IID, and the device app's latency targets.

1. Same FedAvg workload in both: the digits CNN (backbone pretrained here, head
   re-initialized), every virtual device trains the head for one epoch on its IID digits
   partition with the lite Trainer (the same code in both), 10 rounds, every device in
   every round. sporenet: the real sporenet-server daemon and `sporenet-fleet`'s local
   backend (one process); Flower: `flwr.simulation.start_simulation` (Ray, one CPU per
   client actor). Reported: wall seconds per round (fit start to aggregate, medians),
   peak resident memory of each side's whole process tree (sampled every 50 ms) and per
   virtual device.
2. Non-IID: 100 devices, Dirichlet alpha 0.1 vs IID, 30 rounds of sporenet FedAvg; the
   final accuracy ratio and a PNG of both curves.
3. The app: prediction round trip over HTTP (median of 300), personalization of the head on
   50 samples.

    python benchmarks/fleet.py                 # all of it (10-20 minutes on 2 cores)
    python benchmarks/fleet.py --quick         # 100 devices, 3 rounds, 10 non-IID rounds
    python benchmarks/fleet.py --devices 100,1000 --no-flower

Flower runs if `flwr` and `ray` import (see pyproject's comment on installing flwr); if
its simulation fails or exceeds --flower-timeout, the table says so instead of hanging.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common
import numpy as np
from _common import clean_env, cpu_description, free_port, round_seconds

HERE = Path(__file__).resolve()
LR, EPOCHS, BATCH = 0.05, 1, 32


# -- measuring -----------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc/*/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class PeakSampler:
    """Peak of the summed resident memory of process trees, sampled on a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.peak = pids, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = sum(_rss_mb(p) for root in self.pids for p in _tree(root))
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def _blas() -> str:
    from threadpoolctl import threadpool_info

    return (
        ", ".join(
            f"{i['internal_api']} {i.get('architecture', '?')} ({i['num_threads']} threads)"
            for i in threadpool_info()
        )
        or "none"
    )


# -- the model -----------------------------------------------------------------------------


def prepare_model(workdir: Path) -> Path:
    """The digits CNN with a pretrained backbone and a freshly initialized head."""
    path = workdir / "digits_cnn_head.spore"
    if path.exists():
        return path
    from sporenet import cloud, lite
    from sporenet.cloud.export import to_inference_ir

    data = cloud.load_digits()
    cloud.manual_seed(0)
    model = cloud.models.digits_cnn(width=16)
    cloud.fit(
        model,
        data.x_train,
        data.y_train,
        epochs=4,
        batch_size=32,
        optimizer=cloud.Adam(lr=3e-3),
        seed=0,
        verbose=0,
        mode="graph",
    )
    exported = to_inference_ir(model, labels=data.labels, input_range=(0.0, 16.0))
    rng = np.random.default_rng(0)
    head = {
        "head.weight": (rng.normal(size=exported.weights()["head.weight"].shape) * 0.01).astype(
            np.float32
        ),
        "head.bias": np.zeros(10, np.float32),
    }
    lite.save(lite.replace_weights(exported, head), path)
    return path


def start_server(
    state: Path, model: Path, *, rounds: int, devices: int, log: Path
) -> tuple[subprocess.Popen, str]:
    """The sporenet-server daemon for `devices` simulated devices, on a free port."""
    address = f"127.0.0.1:{free_port()}"
    server = _common.start_server(
        state,
        model,
        address=address,
        rounds=rounds,
        min_clients=devices,
        log=log,
        extra=["--max-workers", "256"],
        env=clean_env(),
    )
    return server, address


# -- sporenet ------------------------------------------------------------------------------


def run_sporenet(
    model: Path,
    devices: int,
    rounds: int,
    workdir: Path,
    *,
    partition: str = "iid",
    alpha: float = 0.5,
) -> dict:
    state = Path(tempfile.mkdtemp(prefix=f"state-{devices}-", dir=workdir))
    log = state.with_suffix(".log")
    server, address = start_server(state, model, rounds=rounds, devices=devices, log=log)
    out = state.with_suffix(".json")
    profile = state.with_suffix(".profile.json")
    profile.write_text(json.dumps({"partition": partition, "alpha": alpha, "simulate_time": False}))
    sampler = PeakSampler([server.pid])
    sim_only = PeakSampler([])
    try:
        sim = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sporenet.android_demo.fleet",
                "--server",
                address,
                "--model",
                str(model),
                "--devices",
                str(devices),
                "--rounds",
                str(rounds),
                "--profile",
                str(profile),
                "--json",
                str(out),
                "--plot",
                str(state.with_suffix(".png")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        sampler.pids.append(sim.pid)
        sim_only.pids.append(sim.pid)
        stdout, stderr = sim.communicate(timeout=3600)
        peak, sim_peak = sampler.stop(), sim_only.stop()
    finally:
        server.terminate()
        server.wait(60)
    if sim.returncode != 0:
        raise RuntimeError(f"sporenet-fleet failed:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    report = json.loads(out.read_text())
    return {
        "seconds": round_seconds(log),
        "peak_mb": peak,
        "sim_peak_mb": sim_peak,
        "accuracy": [r["accuracy"] for r in report["rounds"]],
        "initial": report["initial_accuracy"],
    }


# -- Flower --------------------------------------------------------------------------------


def run_flower(model: Path, devices: int, rounds: int, workdir: Path, timeout: float) -> dict:
    out = workdir / f"flower-{devices}.json"
    out.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE),
            "--flower-sim",
            str(model),
            str(devices),
            str(rounds),
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )
    sampler = PeakSampler([proc.pid])
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        sampler.stop()
        return {"error": f"did not finish in {timeout:.0f} s"}
    peak = sampler.stop()
    if proc.returncode != 0 or not out.exists():
        return {"error": f"failed ({proc.returncode}): {stdout.strip().splitlines()[-1:]}"}
    report = json.loads(out.read_text())
    return {**report, "peak_mb": peak}


def flower_sim(model_path: str, devices: int, rounds: int, out: str) -> None:
    """Flower's simulation engine on the same workload (runs in its own process)."""
    import flwr as fl

    from sporenet import lite
    from sporenet.android_demo.fleet import partition
    from sporenet.android_demo.fleet.data import load_digits
    from sporenet.android_demo.fleet.simulator import head_parameters
    from sporenet.federated.client.lite_client import LiteLearner

    model = lite.load(model_path)
    names = sorted(model.weights())
    digits = load_digits()
    x, y = digits.x, digits.y
    parts = partition.iid(len(y), devices, np.random.default_rng([0, 0]))
    trainable = head_parameters(model)
    learner: list[LiteLearner] = []  # one per Ray worker process, as sporenet's group

    class DigitsClient(fl.client.NumPyClient):  # type: ignore[misc]
        def __init__(self, cid: int) -> None:
            self.cid = cid

        def fit(self, parameters, config):  # type: ignore[no-untyped-def]
            if not learner:
                learner.append(
                    LiteLearner(
                        model,
                        x[parts[0]],
                        y[parts[0]],
                        trainable=trainable,
                        lr=LR,
                        epochs=EPOCHS,
                        batch_size=BATCH,
                    )
                )
            lrn = learner[0]
            lrn.x, lrn.y = x[parts[self.cid]], y[parts[self.cid]]
            new, n, metrics = lrn.train(dict(zip(names, parameters, strict=True)), {})
            return [new[k] for k in names], n, metrics

    def client_fn(cid: str) -> fl.client.Client:
        return DigitsClient(int(cid)).to_client()

    w0 = model.weights()
    strategy = _common.timed_fedavg(devices, [np.asarray(w0[k]) for k in names])
    fl.simulation.start_simulation(
        client_fn=client_fn,
        num_clients=devices,
        config=fl.server.ServerConfig(num_rounds=rounds),
        strategy=strategy,
        client_resources={"num_cpus": 1},
        ray_init_args={
            "include_dashboard": False,
            "num_cpus": os.cpu_count() or 2,
            "_node_ip_address": "127.0.0.1",
            "log_to_driver": False,
        },
    )
    Path(out).write_text(json.dumps({"seconds": strategy.round_seconds()}))


# -- the app -------------------------------------------------------------------------------


def app_targets(model: Path, workdir: Path) -> dict:
    import http.client

    from sporenet import cloud
    from sporenet.android_demo.app import App, AppServer

    data = cloud.load_digits()
    app = App(model, Path(tempfile.mkdtemp(prefix="app-data-", dir=workdir)))
    server = AppServer(app, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        body = json.dumps({"pixels": data.x_test[0].reshape(64).tolist()})
        times = []
        for _ in range(300):
            start = time.perf_counter()
            conn.request("POST", "/api/predict", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            times.append(time.perf_counter() - start)
        # 50 training samples (every 5th stored sample is held out: 62 stored -> 50 + 12).
        for k in range(62):
            app.store.add(data.x_test[k].reshape(64), int(data.y_test[k]))
        start = time.perf_counter()
        result = app.personalize(20)
        personalize = time.perf_counter() - start
    finally:
        server.shutdown()
        server.server_close()
        app.close()
    return {
        "predict_ms": statistics.median(times) * 1e3,
        "predict_p95_ms": float(np.percentile(times, 95)) * 1e3,
        "personalize_s": personalize,
        "samples": result["samples"],
    }


# -- main ----------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="100,1000")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--noniid-rounds", type=int, default=30)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-flower", action="store_true")
    p.add_argument("--flower-timeout", type=float, default=1800)
    p.add_argument("--skip", default="", help="comma list of parts to skip: compare,noniid,app")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--flower-sim", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.flower_sim:
        m, n, r, out = args.flower_sim
        flower_sim(m, int(n), int(r), out)
        return
    if args.quick:
        args.devices, args.rounds, args.noniid_rounds = "100", 3, 10
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(",")) - {""}
    model = prepare_model(workdir)
    print(f"CPU: {cpu_description()}")
    print(
        f"BLAS: {_blas()}; timed subprocesses run without OPENBLAS_CORETYPE; "
        f"model {model} ({model.stat().st_size:,} bytes)",
        flush=True,
    )
    flower = not args.no_flower and all(importlib.util.find_spec(m) for m in ("flwr", "ray"))
    if not flower and not args.no_flower:
        print("flwr or ray is not installed: Flower's simulation skipped")

    if "compare" not in skip:
        print(
            f"\n{'devices':>7} {'framework':>9} {'s/round':>8} {'peak MB':>8} "
            f"{'KB/device':>9} {'accuracy':>8}"
        )
        for n in [int(v) for v in args.devices.split(",")]:
            ours = run_sporenet(model, n, args.rounds, workdir)
            s = statistics.median(ours["seconds"])
            print(
                f"{n:>7} {'sporenet':>9} {s:>8.3f} {ours['peak_mb']:>8.0f} "
                f"{ours['peak_mb'] * 1024 / n:>9.0f} {ours['accuracy'][-1]:>8.4f}   "
                f"(server + simulator; the simulator alone {ours['sim_peak_mb']:.0f} MB)",
                flush=True,
            )
            if flower:
                theirs = run_flower(model, n, args.rounds, workdir, args.flower_timeout)
                if "error" in theirs:
                    print(f"{n:>7} {'flower':>9} {theirs['error']}")
                    continue
                f = statistics.median(theirs["seconds"])
                print(
                    f"{n:>7} {'flower':>9} {f:>8.3f} {theirs['peak_mb']:>8.0f} "
                    f"{theirs['peak_mb'] * 1024 / n:>9.0f} {'':>8}"
                )
                mem = theirs["peak_mb"] / ours["peak_mb"]
                print(
                    f"{n:>7} {'ratio':>9} {f / s:>7.2f}x {mem:>7.2f}x"
                    "   (Flower / sporenet: time per round, memory per device)",
                    flush=True,
                )

    if "noniid" not in skip:
        iid = run_sporenet(model, 100, args.noniid_rounds, workdir)
        skew = run_sporenet(
            model, 100, args.noniid_rounds, workdir, partition="dirichlet", alpha=0.1
        )
        from sporenet.android_demo.fleet.png import plot

        png = workdir / "noniid.png"
        plot(
            png,
            {"iid": iid["accuracy"], "dirichlet 0.1": skew["accuracy"]},
            rounds=args.noniid_rounds,
            title="FedAvg over 100 devices: IID vs non-IID",
        )
        best = max(skew["accuracy"])
        print(
            f"\nnon-IID (alpha 0.1) vs IID, 100 devices, {args.noniid_rounds} rounds "
            f"(initial {iid['initial']:.4f}): IID {iid['accuracy'][-1]:.4f}, non-IID "
            f"{skew['accuracy'][-1]:.4f} (best {best:.4f}) = "
            f"{skew['accuracy'][-1] / iid['accuracy'][-1]:.1%} of IID; per round "
            f"IID {' '.join(f'{a:.3f}' for a in iid['accuracy'])}; non-IID "
            f"{' '.join(f'{a:.3f}' for a in skew['accuracy'])}; plot {png} "
            f"(blue: IID, red: non-IID)",
            flush=True,
        )

    if "app" not in skip:
        app = app_targets(model, workdir)
        print(
            f"\napp: prediction round trip {app['predict_ms']:.2f} ms median "
            f"(p95 {app['predict_p95_ms']:.2f} ms; target < 20 ms); personalization of the "
            f"head on {app['samples']} samples, 20 epochs: {app['personalize_s']:.2f} s "
            "(target < 2 s)"
        )
    import resource

    driver = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nbenchmark driver peak RSS {driver:.0f} MB; files in {workdir}")


if __name__ == "__main__":
    main()
