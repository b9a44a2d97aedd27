"""The TFLite conformance suite: each generated single-op .tflite (tflite_cases.py) run by
LiteRT and by sporenet (convert + lite Interpreter), outputs compared.

LiteRT runs its reference kernels (OpResolverType.BUILTIN_REF), whose arithmetic does not
depend on the CPU; where a reference kernel departs from LiteRT's own default kernel
(REFERENCE_DEPARTS), the default one judges, without delegates. Float outputs must agree
within 1e-4 of the output's scale, int8/int16 outputs within one quantization step,
integer and boolean outputs exactly, shapes and dtypes exactly. A case whose op
`supported_tflite_ops()` does not claim is counted as unsupported and not run.

    python -m tests.conformance.tflite_suite             # the table, every case
    python -m tests.conformance.tflite_suite --op CONV_2D --failures
"""

from __future__ import annotations

import argparse
import re
import sys
import zlib
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from sporenet.proto import tflite_schema_generated as tfl
from tests.conformance.tflite_cases import Absent, Case, Const, In, Mode, Role, State, cases
from tests.unit.converter.tflite_builder import TYPES, TfliteBuilder

TYPES.setdefault(np.dtype(np.bool_), tfl.TensorType.BOOL)
TYPES.setdefault(np.dtype(np.int16), tfl.TensorType.INT16)

RTOL = 1e-4
DYNAMIC_SIZE = 3  # a dynamic axis is fed at this size (the file saves it at its spec size)
BUILTIN_NAMES = {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")}


class Result(StrEnum):
    PASSED = "passed"
    UNSUPPORTED = "unsupported"  # the op is not claimed by supported_tflite_ops()
    INVALID = "LiteRT refuses the generated model"  # a generator gap, not a sporenet one
    CONVERSION = "conversion error"
    RUN = "run error"
    MISMATCH = "numeric mismatch"


@dataclass(frozen=True)
class Outcome:
    case: Case
    result: Result
    message: str = ""


# ----------------------------------------------------------------------------- LiteRT


# (op, mode) whose BUILTIN_REF kernel computes something other than the kernel LiteRT
# runs by default (and TensorFlow): the default CPU kernel judges them. Both replacements
# do arithmetic that does not depend on the CPU (integer; float32 within RTOL).
REFERENCE_DEPARTS: dict[tuple[str, Mode], str] = {
    ("SUM", Mode.INT16): (
        "the reference int16 SUM wraps around instead of saturating, as its int8 one "
        "does; the default kernel, integer, saturates"
    ),
    ("SUM", Mode.INT8): (
        "the reference int8 SUM neither saturates nor rounds negative sums (a sum of 300 "
        "wraps to -102; -3 gives -1, not 7); the default kernel, integer, does both"
    ),
    ("LOCAL_RESPONSE_NORMALIZATION", Mode.FLOAT): (
        "the reference LRN sums channels [c - r, c + r), one fewer than the default "
        "kernel's and TensorFlow's [c - r, c + r]"
    ),
}


def _litert_interpreter(data: bytes, *, reference: bool = True) -> Any:
    """LiteRT with its reference kernels (unless `reference` is False); for the few ops
    those lack (CEIL, ELU), its optimized CPU kernels without delegates."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    if not reference:
        return Interpreter(
            model_content=data,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
    try:
        return Interpreter(
            model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_REF
        )
    except ValueError as exc:
        if "find op for builtin opcode" not in str(exc):
            raise
    return Interpreter(
        model_content=data,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )


def run_litert(
    data: bytes, feeds: dict[str, np.ndarray], *, reference: bool = True
) -> dict[str, np.ndarray]:
    """LiteRT's outputs by tensor name, dynamic inputs resized (strictly) first."""
    it = _litert_interpreter(data, reference=reference)
    details = it.get_input_details()
    for d in details:
        if tuple(d["shape"]) != feeds[d["name"]].shape:
            it.resize_tensor_input(d["index"], feeds[d["name"]].shape, strict=True)
    it.allocate_tensors()
    for d in details:
        it.set_tensor(d["index"], feeds[d["name"]])
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


@cache
def litert_registered_ops() -> tuple[str, ...]:
    """Builtin ops LiteRT's default CPU op resolver registers: a one-op model of each code
    is refused with "Didn't find op for builtin opcode" only when it does not."""
    from ai_edge_litert.interpreter import Interpreter

    found = []
    for _code, name in sorted(BUILTIN_NAMES.items()):
        if name in ("CUSTOM", "DELEGATE", "PLACEHOLDER_FOR_GREATER_OP_CODES"):
            continue
        for version in (1, 2, 3):  # a few ops are registered from version 2 on
            b = TfliteBuilder()
            b.op(name, [], [], version=version)
            try:
                Interpreter(model_content=b.build())
            except (RuntimeError, ValueError) as exc:
                if "find op for builtin opcode" in str(exc):
                    continue
            found.append(name)
            break
    return tuple(found)


# ----------------------------------------------------------------------------- writing


def _affine(values: np.ndarray, dtype: Any) -> tuple[float, int]:
    """Scale and zero point covering `values` (and 0): asymmetric int8, symmetric int16."""
    lo, hi = min(float(np.min(values)), 0.0), max(float(np.max(values)), 0.0)
    if np.dtype(dtype) == np.int16:
        return max(abs(lo), abs(hi), 1e-6) / 32767, 0
    scale = max(hi - lo, 1e-6) / 255
    return scale, int(np.clip(round(-128 - lo / scale), -128, 127))


def _quantize(values: np.ndarray, scale: Any, zero: Any, dtype: Any, axis: int = 0) -> np.ndarray:
    info = np.iinfo(dtype)
    scale, zero = np.asarray(scale, np.float64), np.asarray(zero, np.float64)
    if scale.size > 1:
        shape = [1] * values.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return np.clip(np.round(values / scale) + zero, info.min, info.max).astype(dtype)


class _Writer:
    """Writes one case's model: a float probe first (quant=False), then the real one."""

    def __init__(self, case: Case, feeds: dict[str, np.ndarray], probe: dict | None) -> None:
        self.case, self.spec, self.mode = case, case.spec, case.mode
        self.quantized = probe is not None and case.mode in (
            Mode.INT8,
            Mode.INT8_CHANNEL,
            Mode.INT16,
        )
        self.act = np.int16 if case.mode is Mode.INT16 else np.int8
        self.feeds = feeds  # float values by input name
        self.probe = probe  # output name -> (shape signature, float values), or None
        self.b = TfliteBuilder()
        self.fed: dict[str, np.ndarray] = {}
        self.quant: list[tuple[float, int] | None] = []

    def _activation(self, name: str, values: np.ndarray, shape: Any, signature: Any) -> int:
        """A float activation tensor, quantized in the quantized modes (`same_quant`: every
        fed input with the parameters of all of them, as CONCATENATION needs)."""
        if self.quantized and self.spec.op != "QUANTIZE":
            if self.spec.same_quant:
                values = np.concatenate([np.ravel(v) for v in self.feeds.values()])
            scale, zero = _affine(values, self.act)
            self.quant.append((scale, zero))
            return self.b.tensor(
                name, shape, self.act, signature=signature, quant=([scale], [zero], 0)
            )
        self.quant.append(None)
        return self.b.tensor(name, shape, np.float32, signature=signature)

    def inputs(self) -> list[int]:
        indices = []
        weight_scale: np.ndarray | None = None
        for k, arg in enumerate(self.spec.inputs):
            name = f"x{k}"
            if isinstance(arg, In):
                values = self.feeds[name]
                signature = [-1 if a in arg.dynamic else d for a, d in enumerate(arg.shape)]
                if np.dtype(arg.dtype).kind == "f":
                    index = self._activation(name, values, arg.shape, signature)
                    q = self.quant[-1]
                    self.fed[name] = (
                        _quantize(values, q[0], q[1], self.act) if q is not None else values
                    )
                else:
                    index = self.b.tensor(name, arg.shape, arg.dtype, signature=signature)
                    self.quant.append(None)
                    self.fed[name] = values
                self.b.inputs.append(index)
                indices.append(index)
                continue
            if isinstance(arg, State):
                indices.append(self.b.tensor(name, arg.shape, np.float32, variable=True))
                self.quant.append(None)
                continue
            if isinstance(arg, Absent):
                indices.append(-1)
                self.quant.append(None)
                continue
            value = np.asarray(arg.value, arg.dtype)
            if arg.role is Role.PARAM or np.dtype(arg.dtype).kind != "f":
                indices.append(self.b.const(name, value, arg.dtype))
                self.quant.append(None)
            elif arg.role is Role.WEIGHT and self.quantized:
                axis = arg.channel_axis
                moved = np.moveaxis(value, axis, 0).reshape(value.shape[axis], -1)
                per_channel = self.mode is Mode.INT8_CHANNEL
                maxabs = (
                    np.abs(moved).max(axis=1) if per_channel else np.array([np.abs(value).max()])
                )
                scale = np.maximum(maxabs, 1e-6) / 127
                weight_scale = scale
                q = _quantize(value, scale, np.zeros_like(scale), np.int8, axis)
                indices.append(
                    self.b.tensor(
                        name,
                        value.shape,
                        np.int8,
                        data=q,
                        quant=(scale, [0] * scale.size, axis if per_channel else 0),
                    )
                )
                self.quant.append(None)
            elif arg.role is Role.BIAS and self.quantized:
                in_scale = next(q for q in self.quant if q is not None)[0]
                scale = in_scale * (weight_scale if weight_scale is not None else np.array([1.0]))
                dtype = np.int64 if self.mode is Mode.INT16 else np.int32
                scale_full = np.broadcast_to(scale, value.shape) if scale.size > 1 else scale
                q = np.round(value / scale_full).astype(dtype)
                indices.append(
                    self.b.tensor(
                        name, value.shape, dtype, data=q, quant=(scale, [0] * scale.size, 0)
                    )
                )
                self.quant.append(None)
            elif arg.role is Role.WEIGHT and self.mode is Mode.FLOAT16 and self.probe is not None:
                half = self.b.const(f"{name}_f16", value, np.float16)
                wide = self.b.tensor(name, value.shape, np.float32)
                self.b.op("DEQUANTIZE", [half], [wide])
                indices.append(wide)
                self.quant.append(None)
            elif self.quantized:
                dtype = np.int8 if arg.role is Role.ALPHA else self.act
                scale, zero = _affine(value, dtype)
                q = _quantize(value, scale, zero, dtype)
                indices.append(
                    self.b.tensor(name, value.shape, dtype, data=q, quant=([scale], [zero], 0))
                )
                self.quant.append((scale, zero))
            else:
                indices.append(self.b.const(name, value, np.float32))
                self.quant.append(None)
        return indices

    def outputs(self) -> list[int]:
        indices = []
        first = next((q for q in self.quant if q is not None), None)
        for k, dtype in enumerate(self.spec.out_dtypes):
            name = f"y{k}"
            if self.probe is None:  # LiteRT sizes the output; some kernels check its rank
                out_dtype = dtype if dtype is not None else self._first_dtype()
                indices.append(self.b.tensor(name, self._first_shape(), out_dtype))
                continue
            signature, values = self.probe[name]
            shape = list(values.shape)
            out_dtype = np.dtype(dtype if dtype is not None else values.dtype)
            quantize_out = (self.quantized or self.spec.op == "QUANTIZE") and out_dtype.kind == "f"
            if self.spec.op == "DEQUANTIZE":
                quantize_out = False
            if quantize_out:
                fixed = self.spec.fixed_quant.get(self.mode)
                if self.spec.op == "QUANTIZE":
                    scale, zero = _affine(values, self.act)
                elif fixed is not None:
                    scale, zero = fixed
                elif self.spec.same_quant and first is not None:
                    scale, zero = first
                else:
                    scale, zero = _affine(values, self.act)
                indices.append(
                    self.b.tensor(
                        name, shape, self.act, signature=signature, quant=([scale], [zero], 0)
                    )
                )
            else:
                indices.append(self.b.tensor(name, shape, out_dtype, signature=signature))
        return indices

    def _first_dtype(self) -> Any:
        """The dtype of the op's first non-parameter input (its output's by default)."""
        for arg in self.spec.inputs:
            if isinstance(arg, In) or arg.role is not Role.PARAM:
                return arg.dtype
        return np.float32

    def _first_shape(self) -> tuple[int, ...]:
        if self.spec.out_shape is not None:
            return self.spec.out_shape
        arg = self.spec.inputs[0]
        if isinstance(arg, In | State):
            return arg.shape
        return np.shape(arg.value) if isinstance(arg, Const) else (1,)

    def build(self) -> bytes:
        ins = self.inputs()
        outs = self.outputs()
        self.b.op(
            self.spec.op,
            ins,
            outs,
            self.spec.options,
            version=self.spec.version,
            **self.spec.fields,
        )
        for o in outs:
            self.b.output(o)
        return self.b.build()


def _feeds(case: Case, *, saved: bool) -> dict[str, np.ndarray]:
    """Float (or int/bool) values of the fed inputs; dynamic axes at DYNAMIC_SIZE unless
    `saved` (the size the file declares)."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    feeds = {}
    for k, arg in enumerate(case.spec.inputs):
        if not isinstance(arg, In):
            continue
        shape = tuple(
            DYNAMIC_SIZE if a in arg.dynamic and not saved else d for a, d in enumerate(arg.shape)
        )
        kind = np.dtype(arg.dtype).kind
        if kind == "b":
            value = rng.random(shape) < 0.5
        elif kind in "iu":
            value = rng.integers(int(arg.low), int(arg.high) + 1, shape).astype(arg.dtype)
            if case.op in ("FLOOR_DIV", "FLOOR_MOD", "DIV"):
                value[value == 0] = 1
        else:
            value = rng.uniform(arg.low, arg.high, shape).astype(arg.dtype)
        feeds[f"x{k}"] = np.asarray(value)
    return feeds


def build(case: Case) -> tuple[bytes, dict[str, np.ndarray]]:
    """The case's .tflite bytes and its feeds (as the file's input dtypes). Raises
    RuntimeError/ValueError when LiteRT refuses the generated model."""
    feeds = _feeds(case, saved=False)
    probe_case = (
        case if case.mode is Mode.FLOAT else Case(case.name, case.op, case.spec, Mode.FLOAT)
    )
    dynamic = any(isinstance(a, In) and a.dynamic for a in case.spec.inputs)
    if case.op in ("QUANTIZE", "DEQUANTIZE"):  # no float version: the values pass through
        outs = saved_outs = {"y0": feeds["x0"]}
    else:
        probe_model = _Writer(probe_case, feeds, None).build()
        outs = run_litert(probe_model, feeds)
        saved_outs = run_litert(probe_model, _feeds(case, saved=True)) if dynamic else outs
    probe = {}
    for name, value in outs.items():
        other = saved_outs[name]
        signature = (
            [-1 if a != b else b for a, b in zip(value.shape, other.shape, strict=True)]
            if value.ndim == other.ndim
            else list(other.shape)
        )
        probe[name] = (signature, value)
    writer = _Writer(case, feeds, probe)
    # Outputs are declared at the saved sizes (as a converter writes them).
    for name, (signature, value) in list(probe.items()):
        probe[name] = (signature, saved_outs[name] if dynamic else value)
    data = writer.build()
    # the quantized model must also run: LiteRT is the judge of what a valid case is
    run_litert(data, writer.fed)
    return data, writer.fed


# ----------------------------------------------------------------------------- judging


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str:
    """'' when the outputs agree, else what differs."""
    if sorted(got) != sorted(want):
        return f"outputs {sorted(got)}, expected {sorted(want)}"
    for name, w in want.items():
        g = got[name]
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {name!r}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype.kind == "f":
            scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1e-6)
            both_nan = np.isnan(g) & np.isnan(w)
            error = float(np.max(np.where(both_nan, 0, np.abs(g - w)), initial=0.0)) / scale
            if not error <= RTOL:
                return f"output {name!r}: max error {error:.2e} of the output's scale"
        elif w.dtype in (np.int8, np.int16, np.uint8):
            step = int(np.max(np.abs(g.astype(np.int64) - w), initial=0))
            if step > 1:
                return f"output {name!r}: {step} quantization steps off"
        elif not np.array_equal(g, w):
            return f"output {name!r}: values differ"
    return ""


def run_case(case: Case, claimed: frozenset[str] | None = None) -> Outcome:
    """Build, run by LiteRT and by sporenet, compare."""
    from sporenet.converter import convert_tflite, supported_tflite_ops
    from sporenet.lite import Interpreter

    claimed = claimed if claimed is not None else frozenset(supported_tflite_ops())
    if case.op not in claimed:
        return Outcome(case, Result.UNSUPPORTED)
    try:
        data, feeds = build(case)
        want = run_litert(data, feeds, reference=(case.op, case.mode) not in REFERENCE_DEPARTS)
    except (RuntimeError, ValueError) as exc:
        return Outcome(case, Result.INVALID, f"{type(exc).__name__}: {exc}".splitlines()[0])
    try:
        spore = convert_tflite(data)
    except Exception as exc:  # every failure is reported, whatever its type
        return Outcome(case, Result.CONVERSION, f"{type(exc).__name__}: {exc}")
    try:
        got = Interpreter(model_content=spore).run(feeds)
    except Exception as exc:
        return Outcome(case, Result.RUN, f"{type(exc).__name__}: {exc}")
    message = compare(got, want)
    return Outcome(case, Result.MISMATCH if message else Result.PASSED, message)


def run_all(op: str | None = None) -> list[Outcome]:
    from sporenet.converter import supported_tflite_ops

    claimed = frozenset(supported_tflite_ops())
    return [run_case(c, claimed) for c in cases() if op is None or c.op == op]


_REASONS = (
    (re.compile(r"no int8 kernel for (\w+)"), "lite has no int8 kernel for {0}"),
    (re.compile(r"got int16|int16x8"), "lite has no int16x8 kernels"),
    (re.compile(r"half_pixel_centers is not supported"), "nearest resize with half_pixel_centers"),
    (re.compile(r"\(CONV2D_BACKPROP_INP"), "int8 TRANSPOSE_CONV has no int8 kernel in lite"),
)


def reason(outcome: Outcome) -> str:
    """A short reason for a known failure, from its message."""
    text = f"{outcome.case.name} {outcome.message}"
    for pattern, template in _REASONS:
        match = pattern.search(text)
        if match:
            return template.format(*match.groups())
    return f"{outcome.result.value}: {outcome.message}"[:120]


def known_failures_source(outcomes: list[Outcome]) -> str:
    """tflite_known.py's text: every failing case of a claimed op, with its reason."""
    lines = [
        '"""Cases of the TFLite conformance suite known to fail today, each with its reason',
        "(strict xfails: one that starts passing fails the run until it is removed here).",
        "",
        "Regenerate with `python -m tests.conformance.tflite_suite --write-known`, then",
        "`ruff format` it.",
        '"""',
        "",
        "KNOWN_FAILURES: dict[str, str] = {",
    ]
    for o in outcomes:
        if o.result not in (Result.PASSED, Result.UNSUPPORTED):
            lines.append(f"    {o.case.name!r}: (\n        {reason(o)!r}\n    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", help="only this builtin op's cases")
    parser.add_argument("--failures", action="store_true", help="list every failing case")
    parser.add_argument(
        "--write-known", action="store_true", help="rewrite tflite_known.py from this run"
    )
    args = parser.parse_args(argv)
    outcomes = run_all(args.op)
    if args.write_known:
        path = Path(__file__).with_name("tflite_known.py")
        path.write_text(known_failures_source(outcomes))
    counts = Counter(o.result for o in outcomes)
    print(", ".join(f"{r.value}: {counts.get(r, 0)}" for r in Result))
    if args.failures:
        for o in outcomes:
            if o.result not in (Result.PASSED, Result.UNSUPPORTED):
                print(f"{o.case.name}: {o.result.value}: {o.message}"[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
