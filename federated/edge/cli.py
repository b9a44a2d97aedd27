"""`sporenet-edge`: serve devices and aggregate them for a cloud `sporenet-server`.

    sporenet-edge --upstream CLOUD_HOST:PORT --address HOST:PORT --state-dir DIR
                  [--config edge.toml] [--min-clients N] [--secure] ...

Exit codes: 0 when the cloud's job is done (once its devices were told, at most
`--linger` seconds later) or on
SIGTERM/SIGINT, 1 when the cloud refuses the edge (the reason is printed), 2 for a
configuration error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sporenet import __version__
from sporenet.federated.errors import ConfigError
from sporenet.federated.server.cli import FLAGS, _default
from sporenet.lite.console import add_threads, apply_threads

#: The server flags that mean the same on an edge (about serving its devices).
DEVICE_FLAGS = (
    "--address",
    "--state-dir",
    "--min-clients",
    "--min-available",
    "--fraction",
    "--round-timeout",
    "--wait-timeout",
    "--heartbeat-interval",
    "--heartbeat-timeout",
    "--checkpoint-every",
    "--max-update-norm",
    "--max-update-bytes",
    "--max-workers",
    "--max-transfers",
    "--max-upload-memory",
    "--metrics-port",
)
#: Upstream flags: (flag, [upstream] key, help).
UPSTREAM_FLAGS = (
    ("--upstream", "address", "the cloud's sporenet-server, HOST:PORT"),
    ("--name", "name", "this edge's name at the cloud (default: made once, kept in the state dir)"),
    ("--upstream-token", "token", "pre-shared token the cloud's [auth] tokens lists for this edge"),
    (
        "--upstream-key",
        "ed25519_key",
        "Ed25519 private key (PKCS8 PEM) this edge signs its calls with; key id = --name",
    ),
    ("--upstream-ca", "root_certificates", "CA (PEM) the cloud's TLS certificate chains to"),
    ("--upstream-cert", "certificate_chain", "this edge's client certificate (mutual TLS)"),
    ("--upstream-cert-key", "client_key", "the private key of --upstream-cert"),
)

EPILOG = """\
The edge serves devices with the same protocol as the cloud (devices use
sporenet.federated.Client unchanged) and takes part in the cloud's rounds as one
participant weighted by its devices' sample counts. Its model, rounds and strategy come
from the cloud; the TOML file (--config) holds how it serves its devices ([tls], [auth],
[secure_aggregation], min_clients, fraction, round_timeout, ...) and [upstream].
Restart with the same --state-dir to resume the round in progress.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sporenet-edge",
        description="Aggregate a cohort of devices for a cloud sporenet-server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--config", type=Path, help="TOML configuration file; flags override it")
    for flag, key, text in UPSTREAM_FLAGS:
        p.add_argument(flag, dest=f"upstream.{key}", metavar=key.upper(), help=text)
    p.add_argument(
        "--linger",
        dest="upstream.linger",
        metavar="SECONDS",
        type=float,
        help="longest time to keep serving devices after the cloud's job ends, for them to "
        "fetch the final model; the edge exits sooner once every device was told (default: 10)",
    )
    for name, kind, text in FLAGS:
        if name in DEVICE_FLAGS:
            dest = name.lstrip("-").replace("-", "_")
            p.add_argument(name, dest=dest, type=kind, help=text + _default(dest))
    p.add_argument("--tls-cert", dest="tls.cert", metavar="PEM", help="certificate for devices")
    p.add_argument("--tls-key", dest="tls.key", metavar="PEM", help="private key of --tls-cert")
    p.add_argument(
        "--tls-client-ca",
        dest="tls.client_ca",
        metavar="PEM",
        help="CA that device certificates must chain to (mutual TLS)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="serve devices in plaintext (loopback addresses only)",
    )
    p.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--secure",
        action="store_true",
        default=None,
        help="SecAgg+ among this edge's devices ([secure_aggregation] in the config)",
    )
    add_threads(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run `sporenet-edge` with `argv` (default: the command line); the exit code."""
    parser = _parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    apply_threads(parser, ns.threads)
    values = {k: v for k, v in vars(ns).items() if k != "threads"}
    upstream = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("upstream.")}
    overrides = {k: v for k, v in values.items() if k != "config" and not k.startswith("upstream.")}
    from sporenet.federated.edge.config import load_edge_config
    from sporenet.federated.edge.daemon import run_edge

    try:
        config = load_edge_config(ns.config, overrides, upstream)
        return run_edge(config)
    except ConfigError as e:
        print(f"sporenet-edge: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
