"""`sporenet-server`: run the federated daemon, or show the job in a state dir.

    sporenet-server --config server.toml [--address HOST:PORT] [--model init.spore] ...
    sporenet-server status --state-dir DIR

Exit codes: 0 when the job finished (or the daemon stops on SIGTERM/SIGINT), 1 when the
job failed, 2 for a configuration error. With --keep-serving the daemon does not exit when
the job ends.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import gc
import json
import os
import shutil
import socket
import sys
from pathlib import Path

from sporenet import __version__
from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import ServerConfig, StrategyConfig
from sporenet.federated.strategies import STRATEGIES
from sporenet.federated.strategies.staleness import STALENESS
from sporenet.lite.console import add_threads, apply_threads

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
DEFAULTS["strategy"] = StrategyConfig().name

EPILOG = """\
subcommands:
  status --state-dir DIR   print the job in DIR: the phase in words, clients, privacy
                           spent and a table of rounds (--json: everything, as JSON);
                           works whether or not the daemon runs.
                           `sporenet-server status --help` for details.

With --metrics-port the daemon also serves a status page for the operator at
http://HOST:PORT/ (job, phase, participants, accuracy and loss per round, privacy spent
against the budget, recent events), /status.json and Prometheus /metrics.

Flags override the values of --config (a TOML file whose tables, [tls], [auth],
[storage], [secure_aggregation] and [differential_privacy], hold the settings with no
flag). A restarted daemon given the same --state-dir resumes the job where it stopped.
Once the job has ended and its clients were told, the daemon exits: 0 when the job
finished, 1 when it failed (--keep-serving keeps it serving until SIGTERM).
"""


#: The flags for top-level settings: (flag, type, help). Each help gets ServerConfig's default.
FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--address", str, "host:port to listen on; TLS is required unless it is loopback"),
    ("--model", str, "initial .spore model (needed only when the state dir is new)"),
    ("--state-dir", str, "directory for the job's database, model versions and uploads"),
    ("--rounds", int, "fit rounds to run"),
    ("--min-clients", int, "fewest accepted updates a fit round aggregates"),
    ("--min-available", int, "live clients needed to start a round (0: min-clients)"),
    ("--fraction", float, "fraction of live clients sampled per fit round"),
    ("--round-timeout", float, "seconds a phase may take before it closes"),
    (
        "--wait-timeout",
        float,
        "fail the job after this many seconds without enough clients (0: wait forever)",
    ),
    (
        "--max-fruitless-reselections",
        int,
        "fail the job after this many reselections in a row that brought no new update",
    ),
    ("--heartbeat-interval", float, "seconds between a training client's heartbeats"),
    (
        "--heartbeat-timeout",
        float,
        "seconds of silence after which a selected client has dropped out",
    ),
    ("--checkpoint-every", int, "updates folded between checkpoints of the aggregate"),
    ("--evaluate-every", int, "an evaluate phase after every N fit rounds (0: none)"),
    ("--max-update-norm", float, "refuse updates whose L2 norm exceeds this"),
    ("--max-update-bytes", int, "refuse updates larger than this (default: 2 x model + 1 MiB)"),
    ("--strategy", str, "how updates become the next model"),
    (
        "--max-workers",
        int,
        "threads serving the calls beside the sessions (registration, "
        "evaluation reports, secure messages, status)",
    ),
    (
        "--max-transfers",
        int,
        "model and update streams moving at once, half downloads and "
        "half uploads (bounds transfer memory)",
    ),
    (
        "--max-upload-memory",
        int,
        "bytes of updates being received at once (fewer upload slots for big models)",
    ),
    (
        "--metrics-port",
        int,
        "serve the status page (/), /status.json and Prometheus /metrics on this port "
        "(0: any free port)",
    ),
)


def _default(name: str) -> str:
    """' (default: X)' with ServerConfig's default for `name`."""
    value = DEFAULTS[name]
    if value is None or value is dataclasses.MISSING:
        return ""
    return f" (default: {value:g})" if isinstance(value, float) else f" (default: {value})"


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sporenet-server",
        description="Run a federated-learning job: clients connect with\n"
        "sporenet.federated.Client and train the model round by round.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--config", type=Path, help="TOML configuration file; flags override its values")

    for name, kind, text in FLAGS:
        dest = name.lstrip("-").replace("-", "_")
        choices = sorted(STRATEGIES) if dest == "strategy" else None  # listed by --help
        p.add_argument(name, dest=dest, type=kind, choices=choices, help=text + _default(dest))
    p.add_argument(
        "--tls-cert", dest="tls.cert", metavar="PEM", help="server certificate (PEM) for TLS"
    )
    p.add_argument(
        "--tls-key", dest="tls.key", metavar="PEM", help="private key (PEM) of --tls-cert"
    )
    p.add_argument(
        "--tls-client-ca",
        dest="tls.client_ca",
        metavar="PEM",
        help="CA (PEM) that client certificates must chain to (mutual TLS)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="serve plaintext (allowed on loopback addresses only)",
    )
    p.add_argument(
        "--log-level",
        dest="log_level",
        choices=["debug", "info", "warning", "error"],
        help="JSON log verbosity" + _default("log_level"),
    )
    p.add_argument(
        "--keep-models",
        dest="storage.keep_models",
        type=int,
        metavar="N",
        help="model versions kept on disk ([storage] keep_models): the newest N (>= 2) plus"
        " the initial one; 0 keeps all" + _default("keep_models"),
    )
    p.add_argument(
        "--keep-serving",
        dest="keep_serving",
        action="store_true",
        default=None,
        help="keep serving status and model downloads after the job ends (default: exit,"
        " 0 when it finished, 1 when it failed, once its clients were told)",
    )
    p.add_argument(
        "--secure",
        action="store_true",
        default=None,
        help="secure aggregation of fit rounds (settings: [secure_aggregation] in the config)",
    )
    _add_async_flags(p)
    add_threads(p)
    return p


def _add_async_flags(p: argparse.ArgumentParser) -> None:
    """The flags of buffered asynchronous jobs ([job] mode = "async")."""
    p.add_argument(
        "--async",
        dest="async",
        action="store_true",
        default=None,
        help='buffered asynchronous aggregation ([job] mode = "async"): a version per buffer',
    )
    p.add_argument(
        "--concurrency", type=int, help="async jobs: devices training at once ([job] concurrency)"
    )
    p.add_argument(
        "--buffer-size",
        dest="buffer_size",
        type=int,
        help="async jobs: updates per buffer, each full buffer publishes a version",
    )
    p.add_argument(
        "--max-staleness",
        dest="max_staleness",
        type=int,
        help="async jobs: refuse updates trained on a version older than this",
    )
    p.add_argument(
        "--staleness",
        choices=sorted(STALENESS),
        help="async jobs: the staleness weight ([job.staleness] name; options in the table)",
    )


def _status_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sporenet-server status",
        description="Print the job in a state dir: what it is doing in words, its "
        "clients, privacy spent and a table of rounds (--json: all of it as JSON, times "
        "as Unix seconds). Works whether or not the daemon runs.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--state-dir", required=True, type=Path, help="the daemon's --state-dir")
    p.add_argument("--json", action="store_true", help="print the full status as JSON")
    return p


def _status(args: list[str]) -> int:
    from sporenet.federated.server.status import read_status
    from sporenet.federated.server.status_view import summary

    ns = _status_parser().parse_args(args)
    try:
        status = read_status(ns.state_dir)
        print(json.dumps(status, indent=2) if ns.json else summary(status))
    except ConfigError as e:
        print(f"sporenet-server status: error: {e}", file=sys.stderr)
        return 2
    return 0


def check_port_free(address: str) -> None:
    """Refuse, before anything is created, an address another process listens on.

    Raises:
        ConfigError: the port is in use (or the host is not this machine's).
    """
    from sporenet.federated.common.net import split_address

    host, port = split_address(address)
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # A port in TIME_WAIT is free for a listener; one that another socket listens on
        # is not, even with SO_REUSEADDR.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            why = "it is in use" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
            raise ConfigError(
                f"`address`: cannot listen on {address}: {why} (another sporenet-server? "
                "choose another --address)"
            ) from None


def freeze_startup_heap() -> None:
    """Move what the daemon loaded at start (modules, op declarations: tens of MB of
    objects that live as long as the process) out of the garbage collector's sight, so
    the collections the calls' short-lived objects trigger do not traverse it every time.
    Called once, in the daemon's own process (a test that runs daemons in-process would
    freeze its own heap with them)."""
    gc.collect()
    gc.freeze()


def _run(args: list[str]) -> int:
    parser = _run_parser()
    ns = parser.parse_args(args)
    apply_threads(parser, ns.threads)
    overrides = {k: v for k, v in vars(ns).items() if k not in ("config", "threads")}
    from sporenet.federated.server.daemon import run_server
    from sporenet.federated.server.job_settings import resume_config

    created = None
    try:
        config = resume_config(ns.config, overrides)
        check_port_free(config.address)
        state = Path(config.state_dir)
        created = None if state.exists() else state
        freeze_startup_heap()
        return run_server(config)
    except ConfigError as e:
        print(f"sporenet-server: error: {e}", file=sys.stderr)
        if created is not None:
            # A start that failed leaves nothing behind: the next one starts fresh.
            shutil.rmtree(created, ignore_errors=True)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Run `sporenet-server` with `argv` (default: the command line); the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["status"]:
            code = _status(args[1:])
        else:
            code = _run(args[1:] if args[:1] == ["run"] else args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # The reader went away (`... | head`): exit quietly, as other command-line tools do.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
