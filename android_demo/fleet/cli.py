"""`sporenet-fleet`: simulate a fleet of devices against a running sporenet-server.

    sporenet-fleet --server 127.0.0.1:8080 --model digits.spore --devices 1000 --rounds 10
                   [--backend local|ray] [--ray-address ADDR] [--groups G]
                   [--profile fleet.json] [--workers W] [--plot fleet.png] [--json fleet.json]

`--model` is the file the server was started with (the devices train its head on their
digits partitions). Prints accuracy per round, round times, bytes and dropouts, and
writes a PNG of accuracy and participation per round.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet.png import plot
from sporenet.android_demo.fleet.profile import FleetProfile
from sporenet.android_demo.fleet.simulator import BACKENDS, FleetReport, simulate
from sporenet.lite import LiteError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sporenet-fleet", description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True, help="the sporenet-server's host:port")
    p.add_argument("--model", required=True, type=Path, help="the model the server runs")
    p.add_argument("--devices", required=True, type=int)
    p.add_argument("--rounds", required=True, type=int, help="rounds the server runs")
    p.add_argument("--backend", choices=BACKENDS, default="local")
    p.add_argument("--ray-address", help="an existing Ray cluster (default: start one here)")
    p.add_argument("--groups", type=int, help="device groups (Ray actors); default 1 local, 2 ray")
    p.add_argument("--profile", type=Path, help="fleet profile JSON (see profile.py)")
    p.add_argument(
        "--workers", type=int, default=1, help="threads training each group's devices (default 1)"
    )
    p.add_argument(
        "--all-weights", action="store_true", help="train every weight, not only the head"
    )
    p.add_argument("--plot", type=Path, default=Path("fleet.png"), help="PNG to write")
    p.add_argument("--json", type=Path, help="write the report as JSON here too")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


def write_plot(report: FleetReport, path: Path) -> None:
    """Accuracy and participation (devices that uploaded / devices) per round."""
    plot(
        path,
        {
            "accuracy": [r.accuracy for r in report.rounds],
            "participation": [r.trained / report.devices for r in report.rounds],
        },
        rounds=len(report.rounds),
        title=f"{report.devices} devices ({report.backend})",
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        profile = FleetProfile.load(args.profile) if args.profile else FleetProfile()
        model = args.model.read_bytes()
        report = simulate(
            args.server,
            model,
            devices=args.devices,
            rounds=args.rounds,
            profile=profile,
            backend=args.backend,
            groups=args.groups,
            ray_address=args.ray_address,
            head_only=not args.all_weights,
            workers=args.workers,
            timeout=args.timeout,
        )
    except (AppError, LiteError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{report.devices} devices, backend {report.backend}, {report.wall_seconds:.1f} s; "
        f"initial accuracy {report.initial_accuracy:.4f}"
    )
    print(report.table())
    if report.errors:
        print(f"{len(report.errors)} device errors, first: {report.errors[0]}")
    write_plot(report, args.plot)
    print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return 0 if not report.errors else 1
