"""Secure aggregation cost: sporenet SecAgg+ vs plain FedAvg (and Flower's SecAgg+).

For n clients with d float32 parameters and a dropout rate (clients that shared keys but
never upload their masked vector: the costliest case, since the server must rebuild their
pairwise masks), one full round runs in process through the real wire encodings:

- server s/round: server compute only (collect, fold, route, reconstruct, unmask, decode);
- per-client s: one client's compute for the whole round (mean and max over clients);
- bytes/client: everything a contributing client uploads, over a plain float32 upload.

Plain FedAvg is sporenet's WeightedMeanAggregator folding the same float32 updates.
Flower's SecAgg+ runs its own SecAggPlusWorkflow and secaggplus_mod in process (no Ray,
no gRPC) through a minimal in-memory Grid, so both sides are measured the same way.

    python benchmarks/secure_aggregation.py            # n in {10, 100, 1000}, d = 100k
    python benchmarks/secure_aggregation.py --quick    # n in {10, 100}, d = 10k
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from sporenet.federated.aggregation import WeightedMeanAggregator
from sporenet.federated.secagg import SecAggConfig, Stage
from sporenet.federated.secagg.simulation import DropoutPlan, run_round

POOL = 8  # distinct update vectors, reused round-robin (generation is not what we measure)


def _pool(d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 0.05, d).astype(np.float32) for _ in range(POOL)]


def bench_sporenet(n: int, d: int, dropout: float, pool: list[np.ndarray]) -> dict:
    plan = DropoutPlan.random(n, {Stage.MASKED_INPUT: dropout}, seed=n)
    t0 = time.perf_counter()
    report = run_round(lambda i: pool[i % POOL], num_clients=n, vector_length=d,
                       config=SecAggConfig(clipping_range=1.0), dropouts=plan)
    wall = time.perf_counter() - t0
    contributors = report.result.contributors
    want = np.sum([pool[i % POOL].astype(np.float64) for i in contributors], axis=0)
    err = float(np.max(np.abs(report.result.sum - want)))
    if err >= report.result.error_bound:
        raise SystemExit(f"wrong secure sum: error {err} >= bound {report.result.error_bound}")
    client_s = np.array(list(report.client_seconds.values()))
    up = np.array([report.uploaded_bytes[i] for i in contributors])
    return {
        "n": n, "d": d, "dropout": dropout, "survivors": len(contributors),
        "server_s": report.server_seconds, "client_mean_s": float(client_s.mean()),
        "client_max_s": float(client_s.max()), "bytes_per_client": float(up.mean()),
        "bytes_ratio": float(up.mean() / (4 * d)), "max_abs_error": err,
        "error_bound": report.result.error_bound, "wall_s": wall,
    }


def bench_plain(n: int, d: int, dropout: float, pool: list[np.ndarray]) -> dict:
    survivors = n - round(dropout * n)
    agg = WeightedMeanAggregator({"w": ((d,), np.dtype(np.float32))})
    t0 = time.perf_counter()
    for i in range(survivors):
        agg.add(str(i), {"w": pool[i % POOL]}, 1.0)
    agg.result()
    return {"server_s": time.perf_counter() - t0, "bytes_per_client": 4.0 * d}


def bench_flower(n: int, d: int, dropout: float, pool: list[np.ndarray]) -> dict | str:
    """Flower's SecAgg+ round, or the reason it could not run."""
    try:
        from benchmarks import _flower_secaggplus
    except ImportError:
        try:
            import _flower_secaggplus  # type: ignore[no-redef]  # run as a script
        except ImportError as e:
            return f"flwr not importable ({e}); install the `bench` extra"
    try:
        return _flower_secaggplus.run(n, d, dropout, pool)
    except _flower_secaggplus.FlowerUnavailable as e:
        return str(e)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="n in {10, 100}, d = 10k")
    ap.add_argument("--clients", type=int, nargs="+", help="override the client counts")
    ap.add_argument("--params", type=int, help="override the parameter count")
    ap.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1])
    ap.add_argument("--flower-max-clients", type=int, default=100,
                    help="largest n to run Flower at (its pure-Python Shamir is slow)")
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    clients = args.clients or ([10, 100] if args.quick else [10, 100, 1000])
    d = args.params or (10_000 if args.quick else 100_000)
    pool = _pool(d)
    rows = []
    header = (f"{'impl':<10}{'n':>6}{'drop':>6}{'server s':>10}{'client s':>10}"
              f"{'client max':>11}{'bytes/client':>14}{'x plain':>8}")
    print(f"d = {d} float32 parameters\n{header}")
    for n in clients:
        for dropout in args.dropouts:
            plain = bench_plain(n, d, dropout, pool)
            print(f"{'fedavg':<10}{n:>6}{dropout:>6.0%}{plain['server_s']:>10.3f}{'-':>10}"
                  f"{'-':>11}{plain['bytes_per_client']:>14.0f}{1.0:>8.3f}")
            ours = bench_sporenet(n, d, dropout, pool)
            print(f"{'sporenet':<10}{n:>6}{dropout:>6.0%}{ours['server_s']:>10.3f}"
                  f"{ours['client_mean_s']:>10.4f}{ours['client_max_s']:>11.4f}"
                  f"{ours['bytes_per_client']:>14.0f}{ours['bytes_ratio']:>8.3f}")
            row = {"plain": plain, "sporenet": ours}
            if not args.no_flower and n <= args.flower_max_clients:
                flower = bench_flower(n, d, dropout, pool)
                if isinstance(flower, str):
                    print(f"{'flower':<10}{n:>6}{dropout:>6.0%}  skipped: {flower}")
                else:
                    print(f"{'flower':<10}{n:>6}{dropout:>6.0%}{flower['server_s']:>10.3f}"
                          f"{flower['client_mean_s']:>10.4f}{flower['client_max_s']:>11.4f}"
                          f"{flower['bytes_per_client']:>14.0f}{flower['bytes_ratio']:>8.3f}"
                          f"   (round wall {flower['wall_s']:.2f} s)")
                row["flower"] = flower
            rows.append(row)
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
