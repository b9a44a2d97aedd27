"""`sporenet-fleet`: simulate a fleet of devices against a sporenet-server.

    sporenet-fleet --model digits.spore --devices 100 --rounds 10 [--cohort N]
                   [--dataset digits|fashion-mnist|shakespeare] [--data-path P] [--limit N]
                   [--server HOST:PORT] [--backend local|processes|ray] [--ray-address ADDR]
                   [--groups G] [--profile fleet.json] [--workers W] [--fresh-head]
                   [--plot fleet.png] [--json fleet.json] [--threads 1]

Without --server the simulator starts its own sporenet-server on loopback, with the
round settings the fleet needs (see own_server.py). With --server, that server must run
the same --model and --rounds. Prints a line per round as the server aggregates it, then
the table of rounds with what each column means; --plot writes a figure (matplotlib).
Exit codes: 0 every round ran, 1 device errors or rounds missing, 2 a usage error or a
server that cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from sporenet import lite
from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet import data as datasets
from sporenet.android_demo.fleet.backends import BACKENDS
from sporenet.android_demo.fleet.own_server import Cohort, OwnServer
from sporenet.android_demo.fleet.plot import require_matplotlib, write_plot
from sporenet.android_demo.fleet.profile import FleetProfile
from sporenet.android_demo.fleet.simulator import FleetReport, fresh_head, head_parameters, simulate
from sporenet.android_demo.model import logits_output
from sporenet.lite import LiteError
from sporenet.lite.console import make_parser
from sporenet.lite.threads import BlasThreads

EPILOG = """\
Cohort and availability: a round of sporenet-server starts once --min-available clients
are live, samples --fraction of them and aggregates once --min-clients updates are in.
The server's defaults (2 clients) would start round 1 as soon as the first two devices
register. When the simulator starts the server it sets --min-available to the cohort
(or the devices the profile keeps online, if fewer), --fraction to cohort / devices and
--min-clients to half the cohort. Give your own server the same when you pass --server.
"""


def parser() -> argparse.ArgumentParser:
    p = make_parser("sporenet-fleet", __doc__.splitlines()[0], epilog=EPILOG)
    p.add_argument("--model", required=True, type=Path, help="the .spore model the fleet trains")
    p.add_argument("--devices", required=True, type=int, help="virtual devices")
    p.add_argument("--rounds", required=True, type=int, help="federated rounds")
    p.add_argument(
        "--server",
        help="a running sporenet-server's host:port (default: start one on loopback)",
    )
    p.add_argument(
        "--cohort",
        type=int,
        help="devices per round when the simulator starts the server (default: all)",
    )
    p.add_argument(
        "--fresh-head",
        action="store_true",
        help="re-initialize the model's head first, so the curve starts from chance "
        "(with a started server only)",
    )
    p.add_argument(
        "--dataset",
        choices=sorted(datasets.DATASETS),
        default="digits",
        help="what the devices train on (the profile's partition splits it)",
    )
    p.add_argument("--data-path", help="where the dataset's files are (default: its loader's)")
    p.add_argument("--limit", type=int, help="training samples kept (per role for shakespeare)")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="local")
    p.add_argument("--ray-address", help="an existing Ray cluster (default: start one here)")
    p.add_argument(
        "--groups",
        type=int,
        help="device groups (threads, processes or Ray actors); default 1 local, 2 otherwise",
    )
    p.add_argument("--profile", type=Path, help="fleet profile JSON (see profile.py)")
    p.add_argument("--workers", type=int, default=1, help="threads training each group's devices")
    p.add_argument(
        "--all-weights", action="store_true", help="train every weight, not only the head"
    )
    p.add_argument("--plot", type=Path, help="write a PNG of accuracy and participation here")
    p.add_argument("--json", type=Path, help="write the report as JSON here too")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads of the training workers")
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        help="seconds to keep trying to reach --server before giving up",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("sporenet-fleet: interrupted", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        try:
            _check(args)
            profile = FleetProfile.load(args.profile) if args.profile else FleetProfile()
            model = args.model.read_bytes()
            ir = lite.parse(model)  # a model the devices cannot train fails before any start
            logits_output(ir)
            if not args.all_weights:
                head_parameters(ir)
            data = datasets.load(args.dataset, args.data_path, args.limit)
            address = args.server
            if address is None:
                if args.fresh_head:
                    model = fresh_head(model, profile.seed)
                address = _own_server(stack, args, model, profile)
            stack.enter_context(BlasThreads().limit(args.threads))
            report = simulate(
                address,
                model,
                devices=args.devices,
                rounds=args.rounds,
                profile=profile,
                data=data,
                backend=args.backend,
                groups=args.groups,
                ray_address=args.ray_address,
                head_only=not args.all_weights,
                workers=args.workers,
                timeout=args.timeout,
                connect_timeout=args.connect_timeout,
                say=say,
            )
        except (AppError, LiteError, OSError) as exc:
            print(f"sporenet-fleet: error: {exc}", file=sys.stderr)
            return 2
    return _print_report(report, args)


def _check(args: argparse.Namespace) -> None:
    """Refuse flags that cannot work together before anything starts."""
    if args.plot is not None:
        require_matplotlib()
    if args.threads < 1:
        raise AppError(f"--threads must be >= 1, got {args.threads}")
    if args.server and (args.fresh_head or args.cohort):
        raise AppError(
            "--fresh-head and --cohort apply to the server the simulator starts; "
            "leave out --server (or start your server with a fresh model and its "
            "--min-available/--fraction, see --help)"
        )


def _own_server(
    stack: ExitStack, args: argparse.Namespace, model: bytes, profile: FleetProfile
) -> str:
    """Start a sporenet-server on loopback for this run (closed with `stack`): its address."""
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-")))
    (work / "model.spore").write_bytes(model)
    cohort = Cohort.of(args.devices, args.cohort or args.devices, profile.online_fraction)
    server = stack.enter_context(
        OwnServer(work / "model.spore", work / "state", rounds=args.rounds, cohort=cohort)
    )
    say(
        f"started sporenet-server on {server.address}: a round starts with "
        f"{cohort.min_available} live devices, samples {cohort.fraction:.0%} of "
        f"them, aggregates once {cohort.min_clients} updates are in"
    )
    return server.address


def _print_report(report: FleetReport, args: argparse.Namespace) -> int:
    """Print the rounds, write the plot and JSON; the exit code (1: errors or rounds missing)."""
    print(
        f"{report.devices} devices, backend {report.backend}, {report.wall_seconds:.1f} s; "
        f"initial accuracy {report.initial_accuracy:.4f}"
    )
    print(report.table())
    code = 0
    if report.errors:
        print(f"{len(report.errors)} device errors, first: {report.errors[0]}")
        code = 1
    missing = report.missing()
    if missing:
        print(
            f"rounds {missing} did not run: the server's job ended first (was it started with "
            f"fewer than --rounds {args.rounds}?) or the run timed out",
            file=sys.stderr,
        )
        code = 1
    if args.plot is not None:
        write_plot(report, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return code
