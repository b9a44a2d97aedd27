"""`sporenet-convert MODEL.onnx -o MODEL.spore`: convert an ONNX (or .tflite) model and print
a report. The format is told by the file's content (TFLite's identifier), then its suffix.

With --quantize the model (ONNX, or an existing float .spore) is also quantized:
`sporenet-convert model.spore -o model.int8.spore --quantize int8 --calibration data.npz`.

Any failure exits non-zero with a message on stderr and leaves no output file: the model
is written to a temporary file next to the target and renamed into place.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sporenet.converter.errors import ConversionError
from sporenet.lite.console import add_threads, apply_threads, make_parser, quiet_on_closed_pipe
from sporenet.lite.errors import LiteError
from sporenet.lite.format import FILE_IDENTIFIER, load, serialize

if TYPE_CHECKING:
    from sporenet.converter.convert import ConversionReport
    from sporenet.lite.graph import Model

MISSING_ONNX = (
    "the converter needs the onnx package, which is not installed: pip install 'sporenet[onnx]'"
)


# The modules the command runs, imported up front so a missing onnx is one clear line.
ENTRY_POINTS = (
    "sporenet.converter.convert",
    "sporenet.converter.convert_tflite",
    "sporenet.converter.onnx_import.registry",
    "sporenet.converter.quantize",
)


class UsageError(Exception):
    """A command-line argument is malformed."""


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME:D0,D1,... -> (NAME, dims); the name may itself contain ':'."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise UsageError(f"--input-shape {text!r}: expected NAME:D0,D1,... e.g. x:1,3,224,224")
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
    except ValueError:
        raise UsageError(f"--input-shape {text!r}: dimensions must be integers") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"--input-shape {text!r}: dimensions must be >= 0")
    return name, shape


def parse_metadata(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--metadata {text!r}: expected KEY=VALUE")
    return key, value


def _size(n: int) -> str:
    size: float = n
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def is_tflite_file(path: Path) -> bool:
    """A .tflite model: TFLite's file identifier, or the suffix when the file is unreadable."""
    from sporenet.converter.tflite_import.reader import is_tflite

    try:
        with open(path, "rb") as f:
            return is_tflite(f.read(8))
    except OSError:
        return path.suffix.lower() == ".tflite"


def format_report(
    source: Path,
    target: Path,
    report: ConversionReport,
    source_bytes: int,
    *,
    verbose: bool,
    kind: str = "ONNX",
) -> str:
    before, after = report.ir_ops_before, report.ir_ops_after
    origin = (
        f"opset {report.opset}, {sum(report.onnx_ops.values())} ONNX nodes"
        if kind == "ONNX"
        else f"{sum(report.onnx_ops.values())} TFLite operators"
    )
    lines = [
        f"converted {source} -> {target}",
        f"  source     : {report.producer or 'unknown producer'}, {origin} "
        f"({len(report.onnx_ops)} op types)",
        f"  nodes      : {sum(before.values())} imported -> {sum(after.values())} after passes",
        f"  parameters : {report.parameters:,}",
        f"  size       : {_size(source_bytes)} .{kind.lower()} -> "
        f"{_size(report.output_bytes)} .spore "
        f"({report.output_bytes / max(source_bytes, 1):.2f}x)",
        f"  time       : {report.seconds:.2f} s",
    ]
    if report.passes:
        applied = ", ".join(
            f"{name} {count}" for name, count in report.passes.items() if count or verbose
        )
        lines.append(f"  passes     : {len(report.passes)} run; rewrites: {applied or 'none'}")
        for name, why in report.undone.items():
            # A pass whose result the runtime would reject leaves the graph as it was.
            lines.append(f"  undone     : {name} ({why})")
    else:
        lines.append("  passes     : none (--no-optimize)")
    ops = sorted(set(before) | set(after), key=lambda op: (-before.get(op, 0), op))
    shown = ops if verbose else ops[:12]
    lines.append("  ops        : before  after")
    lines.extend(f"    {op:<22}{before.get(op, 0):>6} {after.get(op, 0):>6}" for op in shown)
    if len(ops) > len(shown):
        lines.append(f"    ... {len(ops) - len(shown)} more (--verbose shows all)")
    lines.extend(f"  note       : {note}" for note in report.notes)
    if verbose:
        lines.append(
            f"  {kind + ' ops':<11}: "
            + ", ".join(f"{op} x{n}" for op, n in sorted(report.onnx_ops.items()))
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(
        "sporenet-convert",
        "Convert an ONNX or TFLite model into a sporenet .spore model file and print a report "
        "(op counts before and after the graph passes, parameters, sizes, time); with "
        "--quantize, also quantize it (a .spore input is quantized as it is). The file is "
        "written atomically: a failed conversion leaves no output.",
        epilog="Exit status: 0 on success, 1 when the model cannot be converted or written, "
        "2 for a usage error, 70 for an internal error.\n\n"
        "examples:\n\n"
        "  sporenet-convert model.onnx -o model.spore --input-shape input:1,3,224,224\n"
        "  sporenet-convert model.tflite -o model.spore\n"
        "  sporenet-convert model.spore -o model.int8.spore --quantize int8 "
        "--calibration data.npz\n"
        "  sporenet-convert --list-ops | head",
    )
    _add_conversion_arguments(parser)
    _add_quantization_arguments(parser.add_argument_group("quantization"))
    return parser


def _add_conversion_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the output and how the import runs."""
    parser.add_argument(
        "model",
        nargs="?",
        help="the .onnx or .tflite model to convert (or a .spore model to quantize)",
    )
    parser.add_argument(
        "-o",
        "--output",
        help="where to write the .spore file (default: MODEL with a .spore suffix)",
    )
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME:D0,D1,...",
        help="fix a dynamic input's shape (repeatable), e.g. "
        "input:1,3,224,224, and fold what depends on it; without it dynamic dimensions stay "
        "symbolic and the runtime plans for the sizes it is fed",
    )
    parser.add_argument(
        "--no-optimize",
        action="store_true",
        help="skip the graph optimization passes (constant folding, "
        "BatchNorm folding, activation fusion, ...)",
    )
    parser.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="store a metadata entry in the model (repeatable)",
    )
    parser.add_argument(
        "--list-ops",
        action="store_true",
        help="print every ONNX op type the converter accepts and exit",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="a longer report (every op and pass, the ONNX op counts) and a "
        "traceback on an internal error",
    )


def _add_quantization_arguments(quant: argparse._ArgumentGroup) -> None:
    """--quantize and what it reads and writes."""
    from sporenet.converter.quantize import Method, Mode

    quant.add_argument(
        "--quantize",
        choices=[m.value for m in Mode],
        help="int8/uint8: static (needs --calibration); dynamic: int8 weights, "
        "float activations; fp16: float16 weights",
    )
    quant.add_argument(
        "--calibration",
        metavar="FILE.npz",
        help="calibration samples: one array per model input name, samples on axis 0",
    )
    quant.add_argument(
        "--per-tensor",
        action="store_true",
        help="one weight scale per tensor instead of per output channel",
    )
    quant.add_argument(
        "--calibration-method",
        choices=[m.value for m in Method],
        default="minmax",
        help="how activation ranges are chosen",
    )
    quant.add_argument(
        "--report",
        metavar="FILE.json",
        help="write the per-tensor error report (float vs quantized) as JSON",
    )


def _write_atomically(target: Path, data: bytes) -> None:
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None) -> int:
    """Run `sporenet-convert`; Ctrl-C ends it with a line, not a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("sporenet-convert: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    add_threads(parser)
    args = parser.parse_args(argv)
    apply_threads(parser, args.threads)
    try:
        _require_onnx()
        if args.list_ops:
            from sporenet.converter.onnx_import.registry import supported_onnx_ops

            print("\n".join(supported_onnx_ops()))
            return 0
        if not args.model:
            parser.print_usage(sys.stderr)
            raise _Exit(2, "MODEL is required (or --list-ops)")
        job = _Job.from_args(args)
        converted = _convert_and_write(args, job)
        if args.report:
            _write_quantization_report(Path(args.report), converted.report_json)
    except _Exit as exc:
        print(f"sporenet-convert: {exc.kind}: {exc}", file=sys.stderr)
        return exc.status
    _print_summary(job, converted, verbose=args.verbose)
    return 0


class _Exit(Exception):
    """Ends the command: the message goes to stderr and `status` is the exit status."""

    def __init__(self, status: int, message: str, *, kind: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _require_onnx() -> None:
    """The converter's entry points import onnx; without it the command says so."""
    try:
        for module in ENTRY_POINTS:
            importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != "onnx":
            raise
        raise _Exit(1, MISSING_ONNX) from None


@dataclass(frozen=True)
class _Job:
    """What to convert into where, from the command line, checked."""

    source: Path
    target: Path
    shapes: dict[str, tuple[int, ...]]
    metadata: dict[str, str]
    tflite: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> _Job:
        source = Path(args.model)
        target = Path(args.output) if args.output else source.with_suffix(".spore")
        try:
            shapes = dict(parse_input_shape(s) for s in args.input_shape)
            metadata = dict(parse_metadata(m) for m in args.metadata)
        except UsageError as exc:
            raise _Exit(2, str(exc)) from None
        if (args.calibration or args.report or args.per_tensor) and not args.quantize:
            raise _Exit(2, "--calibration, --report and --per-tensor need --quantize")
        if target.resolve() == source.resolve():
            raise _Exit(2, "the output would overwrite the input")
        if not target.parent.is_dir():
            raise _Exit(1, f"output directory {target.parent} does not exist")
        return cls(source, target, shapes, metadata, is_tflite_file(source))


@dataclass(frozen=True)
class _Converted:
    """The file's bytes, the conversion report (None for a .spore input) and the
    quantization's summary and JSON report (empty without --quantize)."""

    data: bytes
    report: ConversionReport | None
    quant_summary: str = ""
    report_json: str = ""


def _convert_and_write(args: argparse.Namespace, job: _Job) -> _Converted:
    """Convert (and quantize), then write the target atomically; failures become _Exit."""
    try:
        converted = _convert(args, job)
        _write_atomically(job.target, converted.data)
    except (ConversionError, LiteError) as exc:
        raise _Exit(1, str(exc)) from exc
    except OSError as exc:
        raise _Exit(1, f"cannot write {job.target}: {exc.strerror or exc}") from exc
    except Exception as exc:  # a bug: still one line on stderr (the traceback with --verbose)
        if args.verbose:
            traceback.print_exc()
        raise _Exit(
            70,
            f"{type(exc).__name__}: {exc} (please report it with the model)",
            kind="internal error",
        ) from exc
    return converted


def _convert(args: argparse.Namespace, job: _Job) -> _Converted:
    from sporenet.converter.quantize import load_calibration, quantize_model

    model, report = _import(args, job)
    if args.quantize:
        calibration = load_calibration(args.calibration) if args.calibration else None
        result = quantize_model(
            model,
            mode=args.quantize,
            calibration=calibration,
            per_channel=not args.per_tensor,
            method=args.calibration_method,
        )
        converted = _Converted(
            result.data, report, result.report.summary(), result.report.to_json() + "\n"
        )
    elif report is None:
        raise ConversionError(
            f"{job.source} is already a .spore model; give --quantize to compress it"
        )
    else:
        converted = _Converted(serialize(model), report)
    if report is not None:
        report.output_bytes = len(converted.data)
    return converted


def _import(args: argparse.Namespace, job: _Job) -> tuple[Model, ConversionReport | None]:
    """The model in the IR: a .spore loaded as it is, an ONNX or TFLite model converted."""
    from sporenet.converter.convert import convert_onnx_model
    from sporenet.converter.convert_tflite import convert_tflite_model

    if is_spore(job.source):
        if job.shapes or args.no_optimize:
            raise ConversionError(
                "--input-shape and --no-optimize apply to ONNX and TFLite input; "
                f"{job.source} is a .spore model"
            )
        model = load(job.source)
        model.metadata.update(job.metadata)
        return model, None
    convert = convert_tflite_model if job.tflite else convert_onnx_model
    return convert(
        job.source, input_shapes=job.shapes, optimize=not args.no_optimize, metadata=job.metadata
    )


def _write_quantization_report(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise _Exit(1, f"cannot write the report {path}: {exc.strerror or exc}") from None


def _print_summary(job: _Job, converted: _Converted, *, verbose: bool) -> None:
    report = converted.report
    if report is not None:
        print(
            format_report(
                job.source,
                job.target,
                report,
                report.source_bytes or job.source.stat().st_size,
                verbose=verbose,
                kind="TFLite" if job.tflite else "ONNX",
            )
        )
    else:
        print(f"quantized {job.source} -> {job.target}")
    if converted.quant_summary:
        print(converted.quant_summary)


def is_spore(path: Path) -> bool:
    """Whether `path` holds a .spore model (its FlatBuffers file identifier), not ONNX."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head[4:8] == FILE_IDENTIFIER


if __name__ == "__main__":
    sys.exit(main())
