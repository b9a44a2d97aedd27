"""`python -m sporenet`: the version and the commands that come with the package."""

from __future__ import annotations

import sys

import sporenet
from sporenet.lite.console import make_parser, quiet_on_closed_pipe

COMMANDS = (
    (
        "sporenet-inspect MODEL",
        "python -m sporenet.lite",
        "describe a .spore model (ops, tensors, signatures, metadata)",
    ),
    (
        "sporenet-convert MODEL",
        "python -m sporenet.converter",
        "convert an ONNX or TFLite model to .spore, or quantize a .spore model (int8, "
        "fp16; ONNX needs the onnx extra)",
    ),
    (
        "sporenet-server",
        "python -m sporenet.federated.server",
        "the federated-learning server daemon; `sporenet-server status` reads its state",
    ),
    (
        "sporenet-edge --upstream HOST:PORT",
        "python -m sporenet.federated.edge",
        "an edge aggregator: serves devices, takes part in a cloud server's rounds",
    ),
    (
        "sporenet-client --server HOST:PORT --model M --data DIR",
        "python -m sporenet.federated.client",
        "a federated client: trains a .spore model on a folder of .npz files each round",
    ),
    (
        "sporenet-android-demo --model M --data-dir DIR",
        "python -m sporenet.android_demo",
        "the device app: a local page to draw digits, personalize, join a fleet",
    ),
    (
        "sporenet-fleet --model M --devices N --rounds R",
        "python -m sporenet.android_demo.fleet",
        "the fleet simulator: N virtual devices in the rounds of a sporenet-server",
    ),
    (
        "",
        "python -m sporenet.demo",
        "the end-to-end demo: cloud training, device runtime, personalization, federated rounds",
    ),
)
"""(console script, module form, what it does) for each command."""


def overview() -> str:
    """The text `python -m sporenet` prints."""
    summary = (sporenet.__doc__ or "").strip().removeprefix("sporenet: ")
    lines = [f"sporenet {sporenet.__version__}: {summary}", "", "commands:"]
    for script, module, what in COMMANDS:
        lines.append(f"  {script or module}")
        if script:
            lines.append(f"      (also {module})")
        lines.append(f"      {what}")
    lines += [
        "",
        "Each command takes --help. Python packages: sporenet.lite (runtime), "
        "sporenet.converter, sporenet.cloud, sporenet.federated.",
    ]
    return "\n".join(lines)


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    parser = make_parser("python -m sporenet", "Print sporenet's version and its commands.")
    parser.parse_args(argv)
    print(overview())
    return 0


if __name__ == "__main__":
    sys.exit(main())
