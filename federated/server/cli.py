"""`sporenet-server`: run the federated daemon, or show the job in a state dir.

sporenet-server --config server.toml [--address HOST:PORT] [--model init.spore] ...
sporenet-server status --state-dir DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sporenet.federated.errors import ConfigError
from sporenet.federated.server.config import load_config
from sporenet.federated.server.daemon import run_server
from sporenet.federated.server.rounds import read_status
from sporenet.federated.strategies import STRATEGIES


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sporenet-server", description="Run a federated-learning job.")
    p.add_argument("--config", type=Path, help="TOML configuration file; flags override its values")
    p.add_argument("--address", help="host:port to listen on (TLS required unless loopback)")
    p.add_argument("--model", help="initial .spore model (needed when the state dir is new)")
    p.add_argument(
        "--state-dir", dest="state_dir", help="directory for the database and model versions"
    )
    p.add_argument("--rounds", type=int)
    p.add_argument("--min-clients", dest="min_clients", type=int)
    p.add_argument(
        "--min-available",
        dest="min_available",
        type=int,
        help="live clients needed to start a round (default: min-clients)",
    )
    p.add_argument("--fraction", type=float, help="fraction of live clients sampled per round")
    p.add_argument("--round-timeout", dest="round_timeout", type=float, help="seconds per round")
    p.add_argument(
        "--wait-timeout",
        dest="wait_timeout",
        type=float,
        help="fail the job after this long without min-clients (0: wait forever)",
    )
    p.add_argument("--heartbeat-interval", dest="heartbeat_interval", type=float)
    p.add_argument("--heartbeat-timeout", dest="heartbeat_timeout", type=float)
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=int)
    p.add_argument("--evaluate-every", dest="evaluate_every", type=int)
    p.add_argument("--max-update-norm", dest="max_update_norm", type=float)
    p.add_argument("--max-update-bytes", dest="max_update_bytes", type=int)
    p.add_argument("--strategy", choices=sorted(STRATEGIES))
    p.add_argument("--max-workers", dest="max_workers", type=int, help="gRPC worker threads")
    p.add_argument(
        "--max-transfers",
        dest="max_transfers",
        type=int,
        help="concurrent model/update streams (bounds transfer memory)",
    )
    p.add_argument(
        "--max-upload-memory",
        dest="max_upload_memory",
        type=int,
        help="bytes of updates being received at once (fewer upload slots for big models)",
    )
    p.add_argument(
        "--metrics-port", dest="metrics_port", type=int, help="serve Prometheus /metrics"
    )
    p.add_argument("--tls-cert", dest="tls.cert")
    p.add_argument("--tls-key", dest="tls.key")
    p.add_argument(
        "--tls-client-ca", dest="tls.client_ca", help="require client certificates (mTLS)"
    )
    p.add_argument(
        "--insecure", action="store_true", default=None, help="plaintext (loopback only)"
    )
    p.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--secure",
        action="store_true",
        default=None,
        help="secure aggregation of fit rounds (settings: [secure_aggregation] in the config)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["status"]:
        sp = argparse.ArgumentParser(
            prog="sporenet-server status", description="Show the job in a state dir."
        )
        sp.add_argument("--state-dir", required=True, type=Path)
        ns = sp.parse_args(args[1:])
        try:
            print(json.dumps(read_status(ns.state_dir), indent=2))
        except ConfigError as e:
            print(f"sporenet-server status: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args[:1] == ["run"]:
        args = args[1:]
    ns = _run_parser().parse_args(args)
    overrides = {k: v for k, v in vars(ns).items() if k != "config"}
    try:
        config = load_config(ns.config, overrides)
        return run_server(config)
    except ConfigError as e:
        print(f"sporenet-server: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
