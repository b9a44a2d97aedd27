"""`sporenet-inspect MODEL`: print a model's ops, tensors (dtype, quantization, sparsity),
parameters, size by dtype, signatures, metadata."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from sporenet.lite.console import add_threads, apply_threads, make_parser, quiet_on_closed_pipe
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.format import load
from sporenet.lite.graph import Model, Quantization, Tensor, shape_text

_SHOWN_CHANNELS = 3

DEFAULT_MAX_TENSORS = 50
"""Tensors listed before the summary cuts the table short (--all-tensors lists every one)."""


def describe(model: Model, *, max_tensors: int = DEFAULT_MAX_TENSORS) -> str:
    """A human-readable summary of `model`."""
    lines = [f"producer: {model.producer} {model.producer_version}".rstrip()]
    if model.description:
        lines.append(f"description: {model.description}")
    # Parameters: float constants and quantized integer constants (int8 weights).
    params = model.parameter_count() + sum(
        t.data.size
        for t in model.tensors
        if t.data is not None
        and t.data.dtype.kind in "iu"
        and t.quantization is not None
        and t.data.dtype.itemsize == 1
    )
    weight_bytes = sum(t.data.nbytes for t in model.tensors if t.data is not None)
    lines.append(f"parameters: {params:,} ({weight_bytes:,} bytes of constants)")
    lines.append(
        "constants by dtype: "
        + ", ".join(
            f"{dtype} {count:,} tensors {nbytes:,} bytes"
            for dtype, (count, nbytes) in sorted(size_by_dtype(model).items())
        )
    )
    for gi, graph in enumerate(model.graphs):
        ops = Counter(n.op.name for n in graph.nodes)
        lines.append(f"graph {gi} {graph.name!r}: {len(graph.nodes)} nodes")
        for name, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {name:<24} x{count}")
    lines.append(f"tensors: {len(model.tensors)}")
    for i, t in enumerate(model.tensors[:max_tensors]):
        kind = "const" if t.data is not None else "      "
        flag = " trainable" if t.trainable else ""
        extra = "".join(
            f" {part}"
            for part in (describe_quantization(t.quantization), describe_sparsity(t))
            if part
        )
        lines.append(f"  [{i:>3}] {kind} {t.dtype!s:<8} {shape_text(t):<20} {t.name}{flag}{extra}")
    if len(model.tensors) > max_tensors:
        lines.append(f"  ... {len(model.tensors) - max_tensors} more")
    for key, sig in model.signatures.items():
        ins = ", ".join(f"{n} {shape_text(model.tensors[i])}" for n, i in sig.inputs.items())
        outs = ", ".join(f"{n} {shape_text(model.tensors[i])}" for n, i in sig.outputs.items())
        lines.append(f"signature {key!r} (graph {sig.graph}): inputs {ins}; outputs {outs}")
    for key, value in model.metadata.items():
        shown = value if len(value) < 120 else value[:117] + "..."
        lines.append(f"metadata {key}: {shown}")
    return "\n".join(lines)


def size_by_dtype(model: Model) -> dict[str, tuple[int, int]]:
    """dtype name -> (number of constant tensors, bytes they take in the file)."""
    sizes: dict[str, tuple[int, int]] = {}
    for t in model.tensors:
        if t.data is not None:
            count, nbytes = sizes.get(str(t.dtype), (0, 0))
            sizes[str(t.dtype)] = (count + 1, nbytes + stored_bytes(t))
    return sizes


def stored_bytes(t: Tensor) -> int:
    """Bytes a constant takes in the file: its data, or for a sparse tensor the values the
    reader expanded (counted as the nonzeros) plus the bitmask."""
    if t.data is None:
        return 0
    if t.sparsity is None:
        return t.data.nbytes
    nonzero = int(np.count_nonzero(t.data))
    return nonzero * t.data.itemsize + -(-t.data.size // 8)


def _short(values: np.ndarray, fmt: str) -> str:
    flat = np.ravel(values)
    shown = ", ".join(format(v, fmt) for v in flat[:_SHOWN_CHANNELS])
    return f"[{shown}, ... ({flat.size})]" if flat.size > _SHOWN_CHANNELS else f"[{shown}]"


def describe_quantization(q: Quantization | None) -> str:
    """`q: scale=... zp=...` per tensor, abbreviated (first values and count) per channel."""
    if q is None or q.scale.size == 0:
        if q is not None and q.min is not None and q.max is not None:
            return f"range=[{float(q.min.flat[0]):.4g}, {float(q.max.flat[0]):.4g}]"
        return ""
    zp = q.zero_point if q.zero_point.size else np.zeros(1, np.int64)
    if q.scale.size == 1:
        return f"q: scale={float(q.scale[0]):.6g} zp={int(zp.flat[0])}"
    zps = f"zp={int(zp.flat[0])}" if (zp == zp.flat[0]).all() else f"zp={_short(zp, 'd')}"
    return f"q: axis={q.axis} scale={_short(q.scale, '.4g')} {zps}"


def describe_sparsity(t: Tensor) -> str:
    """Share of zeros of a constant, and the storage format when it is stored sparse."""
    if t.data is None or t.data.size == 0 or t.data.dtype.kind not in "fiu":
        return ""
    zeros = 1.0 - np.count_nonzero(t.data) / t.data.size
    stored = " stored sparse" if t.sparsity is not None else ""
    return f"sparsity={zeros:.1%}{stored}" if zeros > 0 or stored else ""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(
        "sporenet-inspect",
        "Print a .spore model's producer, parameter count, ops per graph, tensors "
        "(index, constant or not, dtype, shape, name, trainable), signatures and metadata.",
        epilog="Exit status: 0 when the model is valid, 2 when it cannot be read or the "
        "validator rejects it (its message says what is wrong).\n\n"
        "example:\n\n  sporenet-inspect digits.spore --all-tensors | less",
    )
    parser.add_argument("model", type=Path, help="the .spore model file to describe")
    parser.add_argument(
        "--all-tensors",
        action="store_true",
        help=f"list every tensor, not only the first {DEFAULT_MAX_TENSORS}",
    )
    return parser


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    add_threads(parser)
    args = parser.parse_args(argv)
    apply_threads(parser, args.threads)
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
