"""`sporenet-client`: take part in a federated job with a .spore model and a folder of data.

    sporenet-client --server HOST:PORT --model digits.spore --data DIR
                    [--name phone-1] [--token TOKEN] [--ca server-ca.pem]
                    [--epochs 1] [--lr 0.05] [--batch-size 32] [--trainable NAME ...]
                    [--out final.spore] [--threads 1]

The lite runtime trains the model on DIR's .npz files (see data_dir.py) each round the
server asks, and reports evaluation on its held-out part. Exit codes: 0 when the job
finished (the final model is written to --out if given), 1 when it failed or the server
refused this client, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sporenet import lite
from sporenet.federated.client.data_dir import load_data_dir
from sporenet.federated.common.auth import Credentials
from sporenet.federated.errors import ConfigError, FederatedError
from sporenet.lite.console import add_threads, apply_threads, make_parser


def parser() -> argparse.ArgumentParser:
    p = make_parser("sporenet-client", __doc__.splitlines()[0], epilog=__doc__.split("\n\n")[2])
    p.add_argument("--server", required=True, help="the sporenet-server (or edge) host:port")
    p.add_argument("--model", required=True, type=Path, help="the .spore model the job trains")
    p.add_argument("--data", required=True, type=Path, help="folder of .npz files (x, y)")
    p.add_argument("--name", default="sporenet-client", help="this client's name at the server")
    p.add_argument("--token", help="the server's client token, if it asks for one")
    p.add_argument("--ca", type=Path, help="PEM of the CA that signed the server's TLS certificate")
    p.add_argument("--epochs", type=int, default=1, help="local epochs per round")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--trainable",
        nargs="+",
        help="tensors to train (default: those the model flags trainable, else every weight)",
    )
    p.add_argument("--out", type=Path, help="write the job's final model here")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_threads(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    apply_threads(p, args.threads)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(message)s")
    from sporenet.federated.client.lite_client import LiteLearner

    try:
        model = lite.load(args.model)
        (x, y), (xe, ye) = load_data_dir(args.data)
        learner = LiteLearner(
            model,
            x,
            y,
            x_eval=xe,
            y_eval=ye,
            trainable=set(args.trainable) if args.trainable else None,
            lr=args.lr,
            epochs=args.epochs,
            batch_size=args.batch_size,
            num_threads=None,  # the process's count, set by --threads
        )
        credentials = Credentials(
            token=args.token, root_certificates=args.ca.read_bytes() if args.ca else None
        )
        client = learner.client(args.server, name=args.name, credentials=credentials)
    except (ConfigError, lite.LiteError, OSError) as exc:
        print(f"sporenet-client: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"sporenet-client {args.name}: {len(y)} samples to train on, {len(ye)} to evaluate; "
        f"joining {args.server}",
        flush=True,
    )
    try:
        final = client.run()
    except KeyboardInterrupt:
        print("sporenet-client: interrupted", file=sys.stderr)
        return 130
    except FederatedError as exc:
        print(f"sporenet-client: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if final is None:
        return 0
    if args.out is not None:
        lite.save(lite.replace_weights(model, final), args.out)
        print(f"the job finished; final model written to {args.out}")
    else:
        print("the job finished")
    return 0
