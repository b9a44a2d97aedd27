"""`sporenet-inspect MODEL`: print a model's ops, tensors, parameters, signatures, metadata."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from sporenet.lite.errors import ModelFormatError
from sporenet.lite.format import load
from sporenet.lite.graph import Model


def describe(model: Model, *, max_tensors: int = 50) -> str:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sporenet-inspect", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--all-tensors", action="store_true", help="list every tensor")
    args = parser.parse_args(argv)
    try:
        model = load(args.model)
    except ModelFormatError as exc:
        print(f"sporenet-inspect: {args.model}: invalid model: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sporenet-inspect: {exc}", file=sys.stderr)
        return 2
    print(f"model: {args.model} ({args.model.stat().st_size:,} bytes)")
    print(describe(model, max_tensors=10**9 if args.all_tensors else 50))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
