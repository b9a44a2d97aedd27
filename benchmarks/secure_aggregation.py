"""Secure aggregation cost: sporenet SecAgg+ vs plain FedAvg (and Flower's SecAgg+).

For n clients with d float32 parameters and a dropout rate (clients that shared keys but
never upload their masked vector: the costliest case, since the server must rebuild their
pairwise masks), one full round runs in process through the real wire encodings:

- server s/round: server compute only (collect, fold, route, reconstruct, unmask, decode);
- per-client s: one client's compute for the whole round (mean and max over clients);
- bytes/client: everything a contributing client uploads, over a plain float32 upload.

Plain FedAvg is sporenet's WeightedMeanAggregator folding the same float32 updates.
Flower's SecAgg+ runs its own SecAggPlusWorkflow and secaggplus_mod in process (no Ray,
no gRPC) through a minimal in-memory Grid, every message through its protobuf wire form,
with the same neighbour count and threshold. Flower is not in the `bench` extra (it pins
protobuf<7; see pyproject.toml): `pip install --no-deps flwr` and its small deps.

    python benchmarks/secure_aggregation.py            # n in {10, 100, 1000}, d = 100k
    python benchmarks/secure_aggregation.py --quick    # n in {10, 100}, d = 10k
    python benchmarks/secure_aggregation.py --reconstruction   # unmask-stage decoding only

--reconstruction times what the server does with the shares at unmask, for every
surviving client's self-mask seed (n secrets, k shares each, threshold t): the Lagrange
interpolation of the first t shares (what the server did before robust decoding, which
cannot notice a bad share) against Reed-Solomon decoding of all k shares with no bad
share, with one tampering holder, and with the most bad shares k shares can correct.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from _common import cpu_description

from sporenet.federated.aggregation import WeightedMeanAggregator
from sporenet.federated.secagg import SecAggConfig, Stage, decoding, shamir
from sporenet.federated.secagg.simulation import DropoutPlan, run_round

POOL = 8  # distinct update vectors, reused round-robin (generation is not what we measure)


def _pool(d: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 0.05, d).astype(np.float32) for _ in range(POOL)]


def bench_sporenet(n: int, d: int, dropout: float, pool: list[np.ndarray]) -> dict:
    plan = DropoutPlan.random(n, {Stage.MASKED_INPUT: dropout}, seed=n)
    t0 = time.perf_counter()
    report = run_round(
        lambda i: pool[i % POOL],
        num_clients=n,
        vector_length=d,
        config=SecAggConfig(clipping_range=1.0),
        dropouts=plan,
    )
    wall = time.perf_counter() - t0
    contributors = report.result.contributors
    want = np.sum([pool[i % POOL].astype(np.float64) for i in contributors], axis=0)
    err = float(np.max(np.abs(report.result.sum - want)))
    if err >= report.result.error_bound:
        raise SystemExit(f"wrong secure sum: error {err} >= bound {report.result.error_bound}")
    client_s = np.array(list(report.client_seconds.values()))
    up = np.array([report.uploaded_bytes[i] for i in contributors])
    return {
        "n": n,
        "d": d,
        "dropout": dropout,
        "survivors": len(contributors),
        "server_s": report.server_seconds,
        "client_mean_s": float(client_s.mean()),
        "client_max_s": float(client_s.max()),
        "bytes_per_client": float(up.mean()),
        "bytes_ratio": float(up.mean() / (4 * d)),
        "max_abs_error": err,
        "error_bound": report.result.error_bound,
        "wall_s": wall,
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
    """Flower's SecAgg+ round at the same neighbour count, or the reason it could not run."""
    try:
        return _run_flower(n, d, dropout, pool)
    except ImportError as e:
        return f"flwr not importable ({e}); install the `bench` extra"


def _run_flower(n: int, d: int, dropout: float, pool: list[np.ndarray]) -> dict:
    import logging
    import uuid

    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Context, Message, RecordDict
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
    )
    from flwr.common.secure_aggregation.secaggplus_constants import Stage as FlowerStage
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.server import ServerConfig
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.serverapp.grid import Grid
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity

    logging.getLogger("flwr").setLevel(logging.ERROR)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    plan = DropoutPlan.random(n, {Stage.MASKED_INPUT: dropout}, seed=n)
    dropped = {i + 1 for i in plan.silent(Stage.MASKED_INPUT)}  # Flower node ids start at 1
    late = {FlowerStage.COLLECT_MASKED_VECTORS, FlowerStage.UNMASK}

    class DirectGrid(Grid):
        """Delivers each message to its ClientApp in process, through the protobuf wire form."""

        def __init__(self, app: ClientApp) -> None:
            self._run = Run.create_empty(1)
            self.app = app
            self.nodes = list(range(1, n + 1))
            self.ctx = {i: Context(1, i, {}, RecordDict(), {}) for i in self.nodes}
            self.client_s = dict.fromkeys(self.nodes, 0.0)
            self.up = dict.fromkeys(self.nodes, 0)
            self.wire_s = 0.0
            self.replies: dict[str, Message] = {}

        def set_run(self, run: Run) -> None:
            self._run = run

        @property
        def run(self) -> Run:
            return self._run

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self) -> list[int]:
            return list(self.nodes)

        def push_messages(self, messages) -> list[str]:
            ids = []
            for m in messages:
                m.metadata.__dict__["_message_id"] = str(uuid.uuid4())
                m.metadata.__dict__["_src_node_id"] = 0
                node = m.metadata.dst_node_id
                cfg = m.content.config_records.get(RECORD_KEY_CONFIGS)
                if node in dropped and cfg is not None and cfg.get(Key.STAGE) in late:
                    continue  # dropped before the masked upload: never answers again
                t0 = time.perf_counter()
                m = message_from_proto(message_to_proto(m))
                t1 = time.perf_counter()
                reply = self.app(m, self.ctx[node])
                t2 = time.perf_counter()
                wire = message_to_proto(reply)
                self.up[node] += wire.ByteSize()
                self.replies[m.metadata.message_id] = message_from_proto(wire)
                self.client_s[node] += t2 - t1
                self.wire_s += (t1 - t0) + (time.perf_counter() - t2)
                ids.append(m.metadata.message_id)
            return ids

        def pull_messages(self, message_ids) -> list[Message]:
            return [self.replies.pop(i) for i in message_ids if i in self.replies]

        def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
            return self.pull_messages(self.push_messages(messages))

    class Client(NumPyClient):
        def __init__(self, node: int) -> None:
            self.node = node

        def fit(self, parameters, config):
            return [pool[(self.node - 1) % POOL]], 1, {}

    app = ClientApp(
        client_fn=lambda context: Client(context.node_id).to_client(), mods=[secaggplus_mod]
    )
    grid = DirectGrid(app)
    params = SecAggConfig().resolve(n)
    strategy = FedAvg(
        fraction_fit=1.0,
        min_fit_clients=n,
        min_available_clients=n,
        fraction_evaluate=0.0,
        initial_parameters=ndarrays_to_parameters([np.zeros(d, np.float32)]),
    )
    context = LegacyContext(
        Context(1, 0, {}, RecordDict(), {}), config=ServerConfig(num_rounds=1), strategy=strategy
    )
    # Flower counts a client's own share: num_shares = neighbours + 1 (odd), same threshold.
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(
            num_shares=params.num_neighbours + 1,
            reconstruction_threshold=params.threshold + 1,
            clipping_range=1.0,
        )
    )
    t0 = time.perf_counter()
    workflow(grid, context)
    wall = time.perf_counter() - t0
    got = parameters_to_ndarrays(
        compat.arrayrecord_to_parameters(context.state.array_records["parameters"], keep_input=True)
    )[0]
    survivors = [i for i in grid.nodes if i not in dropped]
    want = np.mean([pool[(i - 1) % POOL] for i in survivors], axis=0)
    completed = bool(np.max(np.abs(got - want)) < 1e-2)
    client_s = np.array(list(grid.client_s.values()))
    return {
        "n": n,
        "d": d,
        "dropout": dropout,
        "completed": completed,
        "server_s": wall - client_s.sum() - grid.wire_s,
        "client_mean_s": float(client_s.mean()),
        "client_max_s": float(client_s.max()),
        "bytes_per_client": float(np.mean([grid.up[i] for i in survivors])),
        "bytes_ratio": float(np.mean([grid.up[i] for i in survivors]) / (4 * d)),
        "wall_s": wall,
    }


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def bench_reconstruction(n: int, k: int, t: int, repeats: int) -> dict:
    """ms to recover n secrets from k shares each: first-t Lagrange vs robust decoding."""
    rng = np.random.default_rng(n + k + t)
    secrets = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    # Each secret's holders are k of the n clients (coordinates: index + 1), as at unmask.
    xs = np.stack([np.sort(rng.choice(n, size=k, replace=False)) + 1 for _ in range(n)])
    ys = np.stack([shamir.share(secrets[i : i + 1], xs[i], t)[0] for i in range(n)])
    e = decoding.correctable(k, t)
    row: dict = {"n": n, "k": k, "t": t, "correctable": e}
    row["lagrange_first_t_ms"] = _median_ms(lambda: shamir.reconstruct(xs, ys, t), repeats)
    for label, bad in (("robust_clean_ms", 0), ("robust_one_bad_ms", 1), ("robust_max_bad_ms", e)):
        tampered = ys.copy()
        for i in range(n):
            for j in rng.choice(k, size=bad, replace=False):
                tampered[i, j, 0] = (tampered[i, j, 0] + 1) % shamir.PRIME
        got = decoding.decode(xs, tampered, t)
        if not (got.ok.all() and np.array_equal(got.secrets, secrets)):
            raise SystemExit(f"robust decoding failed with {bad} bad shares per secret")
        if int(got.bad.sum()) != bad * n:
            raise SystemExit(f"robust decoding located {int(got.bad.sum())} of {bad * n}")
        row[label] = _median_ms(lambda tampered=tampered: decoding.decode(xs, tampered, t), repeats)
    return row


def _runtime_note() -> str:
    import resource

    try:
        from threadpoolctl import threadpool_info

        blas = ", ".join(
            f"{p.get('internal_api')} {p.get('architecture')} x{p.get('num_threads')}"
            for p in threadpool_info()
            if p.get("user_api") == "blas"
        )
    except ImportError:
        blas = "threadpoolctl not installed"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return f"CPU: {cpu_description()}\nBLAS: {blas or 'none loaded'}; peak RSS {peak:.0f} MB"


def run_reconstruction(args: argparse.Namespace) -> int:
    cases = [(100, 98, 50), (100, 20, 11), (1000, 30, 16)]
    print(
        f"{'n':>6}{'k':>5}{'t':>5}{'e':>4}{'lagrange t':>12}{'robust':>9}"
        f"{'x':>7}{'1 bad':>9}{'e bad':>9}   (ms per reconstruction of n secrets, median)"
    )
    rows = []
    for n, k, t in cases:
        r = bench_reconstruction(n, k, t, args.repeats)
        rows.append(r)
        print(
            f"{n:>6}{k:>5}{t:>5}{r['correctable']:>4}{r['lagrange_first_t_ms']:>12.1f}"
            f"{r['robust_clean_ms']:>9.1f}"
            f"{r['robust_clean_ms'] / r['lagrange_first_t_ms']:>7.1f}"
            f"{r['robust_one_bad_ms']:>9.1f}{r['robust_max_bad_ms']:>9.1f}"
        )
        sys.stdout.flush()
    print(_runtime_note())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="n in {10, 100}, d = 10k")
    ap.add_argument("--clients", type=int, nargs="+", help="override the client counts")
    ap.add_argument("--params", type=int, help="override the parameter count")
    ap.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1])
    ap.add_argument(
        "--flower-max-clients",
        type=int,
        default=100,
        help="largest n to run Flower at (its pure-Python Shamir is slow)",
    )
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument(
        "--reconstruction", action="store_true", help="time the unmask-stage decoding only"
    )
    ap.add_argument("--repeats", type=int, default=7, help="timings per reconstruction case")
    args = ap.parse_args(argv)
    if args.reconstruction:
        return run_reconstruction(args)
    clients = args.clients or ([10, 100] if args.quick else [10, 100, 1000])
    d = args.params or (10_000 if args.quick else 100_000)
    pool = _pool(d)
    rows = []
    header = (
        f"{'impl':<10}{'n':>6}{'drop':>6}{'server s':>10}{'client s':>10}"
        f"{'client max':>11}{'bytes/client':>14}{'x plain':>8}"
    )
    print(f"d = {d} float32 parameters\n{header}")
    for n in clients:
        for dropout in args.dropouts:
            plain = bench_plain(n, d, dropout, pool)
            print(
                f"{'fedavg':<10}{n:>6}{dropout:>6.0%}{plain['server_s']:>10.3f}{'-':>10}"
                f"{'-':>11}{plain['bytes_per_client']:>14.0f}{1.0:>8.3f}"
            )
            ours = bench_sporenet(n, d, dropout, pool)
            print(
                f"{'sporenet':<10}{n:>6}{dropout:>6.0%}{ours['server_s']:>10.3f}"
                f"{ours['client_mean_s']:>10.4f}{ours['client_max_s']:>11.4f}"
                f"{ours['bytes_per_client']:>14.0f}{ours['bytes_ratio']:>8.3f}"
            )
            row = {"plain": plain, "sporenet": ours}
            if not args.no_flower and n <= args.flower_max_clients:
                flower = bench_flower(n, d, dropout, pool)
                if isinstance(flower, str):
                    print(f"{'flower':<10}{n:>6}{dropout:>6.0%}  skipped: {flower}")
                else:
                    print(
                        f"{'flower':<10}{n:>6}{dropout:>6.0%}{flower['server_s']:>10.3f}"
                        f"{flower['client_mean_s']:>10.4f}{flower['client_max_s']:>11.4f}"
                        f"{flower['bytes_per_client']:>14.0f}{flower['bytes_ratio']:>8.3f}"
                        f"   (round wall {flower['wall_s']:.2f} s"
                        f"{'' if flower['completed'] else ', round HALTED'})"
                    )
                row["flower"] = flower
            elif not args.no_flower:
                print(
                    f"{'flower':<10}{n:>6}{dropout:>6.0%}  skipped: n > --flower-max-clients="
                    f"{args.flower_max_clients} (measured once at 1000 x 100k, 10% dropout, on a "
                    "loaded 2-core box: 126 s server, 429 s round wall; raise the flag to rerun)"
                )
            rows.append(row)
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
