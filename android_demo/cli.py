"""`sporenet-android-demo` / `python -m sporenet.android_demo`: run the device app.

    python -m sporenet.android_demo --model digits.spore --data-dir ~/.sporenet \\
        [--port 8000] [--server HOST:PORT] [--min-battery 50] [--idle-after 30]
        [--simulate-battery 100] [--simulate-unplugged] [--simulate-metered] [--threads 1]
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path

from sporenet.android_demo.app import App, AppServer
from sporenet.android_demo.errors import AppError
from sporenet.android_demo.policy import DevicePolicy, Sensors
from sporenet.lite import LiteError
from sporenet.lite.console import make_parser
from sporenet.lite.errors import ModelFormatError


def parser() -> argparse.ArgumentParser:
    p = make_parser(
        "sporenet-android-demo",
        "The sporenet device app on 127.0.0.1: draw digits, get predictions, personalize "
        "the model on your own samples, and (opt-in) train for the fleet.",
    )
    p.add_argument("--model", required=True, type=Path, help="the shipped .spore model")
    p.add_argument(
        "--data-dir",
        required=True,
        type=Path,
        help="where the user's samples and personalized model are kept",
    )
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free)")
    p.add_argument("--server", help="opt in to federated learning with this sporenet-server")
    p.add_argument("--token", help="the federated server's client token, if it asks for one")
    p.add_argument(
        "--min-battery",
        type=float,
        default=50.0,
        help="train for the fleet only above this battery percentage",
    )
    p.add_argument(
        "--idle-after",
        type=float,
        default=30.0,
        help="seconds without use after which the device counts as idle",
    )
    p.add_argument(
        "--simulate-battery",
        type=float,
        default=100.0,
        help="battery percentage where termux-api is absent",
    )
    p.add_argument(
        "--simulate-unplugged", action="store_true", help="simulate a device that is not charging"
    )
    p.add_argument("--simulate-metered", action="store_true", help="simulate a metered network")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS threads for predictions and personalization (the app's models are "
        "small: more threads only contend with the phone's other work)",
    )
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the app until Ctrl-C (which ends it with a line, not a traceback)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    if not 0 <= args.port < 65536:
        print(f"error: --port must be in [0, 65535], got {args.port}", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    try:
        policy = DevicePolicy(min_battery=args.min_battery)
        sensors = Sensors(
            charging=not args.simulate_unplugged,
            battery=args.simulate_battery,
            unmetered=not args.simulate_metered,
            idle_after=args.idle_after,
        )
        options = {"token": args.token} if args.token else None
        app = App(
            args.model,
            args.data_dir,
            server=args.server,
            policy=policy,
            sensors=sensors,
            client_options=options,
            num_threads=args.threads,
        )
    except ModelFormatError as exc:
        print(f"error: {args.model}: {exc}", file=sys.stderr)
        return 2
    except (AppError, LiteError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        server = AppServer(app, args.port)
    except OSError as exc:
        app.close()
        why = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        print(
            f"error: cannot listen on 127.0.0.1:{args.port}: {why} (another app running? "
            "--port 0 picks a free port)",
            file=sys.stderr,
        )
        return 2
    app.start()
    print(
        f"sporenet device app on {server.url} (model {app.model.version}, "
        f"{app.store.count()} samples)",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        app.close()
    return 0
