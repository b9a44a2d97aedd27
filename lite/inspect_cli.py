"""`sporenet-inspect MODEL`: print a model's ops, tensors, parameters, signatures, metadata."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from sporenet.lite.console import make_parser, quiet_on_closed_pipe
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.format import load
from sporenet.lite.graph import Model

DEFAULT_MAX_TENSORS = 50
"""Tensors listed before the summary cuts the table short (--all-tensors lists every one)."""


def describe(model: Model, *, max_tensors: int = DEFAULT_MAX_TENSORS) -> str:
    """A human-readable summary of `model`."""
    lines = [f"producer: {model.producer} {model.producer_version}".rstrip()]
    if model.description:
        lines.append(f"description: {model.description}")
    params = model.parameter_count()
    weight_bytes = sum(t.data.nbytes for t in model.tensors if t.data is not None)
    lines.append(f"parameters: {params:,} ({weight_bytes:,} bytes of constants)")
    for gi, graph in enumerate(model.graphs):
        ops = Counter(n.op.name for n in graph.nodes)
        lines.append(f"graph {gi} {graph.name!r}: {len(graph.nodes)} nodes")
        for name, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {name:<24} x{count}")
    lines.append(f"tensors: {len(model.tensors)}")
    for i, t in enumerate(model.tensors[:max_tensors]):
        kind = "const" if t.data is not None else "      "
        flag = " trainable" if t.trainable else ""
        lines.append(f"  [{i:>3}] {kind} {t.dtype!s:<8} {list(t.shape)!s:<20} {t.name}{flag}")
    if len(model.tensors) > max_tensors:
        lines.append(f"  ... {len(model.tensors) - max_tensors} more")
    for key, sig in model.signatures.items():
        lines.append(f"signature {key!r} (graph {sig.graph}): inputs {list(sig.inputs)} "
                     f"outputs {list(sig.outputs)}")
    for key, value in model.metadata.items():
        shown = value if len(value) < 120 else value[:117] + "..."
        lines.append(f"metadata {key}: {shown}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(
        "sporenet-inspect",
        "Print a .spore model's producer, parameter count, ops per graph, tensors "
        "(index, constant or not, dtype, shape, name, trainable), signatures and metadata.",
        epilog="Exit status: 0 when the model is valid, 2 when it cannot be read or the "
        "validator rejects it (its message says what is wrong).\n\n"
        "example:\n\n  sporenet-inspect digits.spore --all-tensors | less")
    parser.add_argument("model", type=Path, help="the .spore model file to describe")
    parser.add_argument("--all-tensors", action="store_true",
                        help=f"list every tensor, not only the first {DEFAULT_MAX_TENSORS}")
    return parser


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model = load(args.model)
    except ModelFormatError as exc:
        print(f"sporenet-inspect: {args.model}: invalid model: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sporenet-inspect: {exc}", file=sys.stderr)
        return 2
    print(f"model: {args.model} ({args.model.stat().st_size:,} bytes)")
    print(describe(model, max_tensors=10**9 if args.all_tensors else DEFAULT_MAX_TENSORS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
