"""The conformance report: every ONNX backend node case of every claimed op, pass or fail.

Unlike the pytest harness (which skips EXCLUDED cases and xfails KNOWN_FAILURES), the
report runs every node case whose op types `sporenet-convert --list-ops` claims: all
element types (those the IR stores and those it cannot), shape arguments fed as graph
inputs, training-mode variants. Nothing is left out; each failure gets one reason class.

    python -m tests.conformance.report                        # print the summary
    python -m tests.conformance.report --write docs/conformance.md
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import onnx

from sporenet.lite import lowp
from sporenet.lite.dtypes import NUMPY_TO_IR
from tests.conformance import onnx_backend as ob
from tests.conformance import sections

BEGIN = "<!-- onnx-conformance: begin (python -m tests.conformance.report) -->"
END = "<!-- onnx-conformance: end -->"


class Reason(StrEnum):
    """Why a case fails, from the cheapest to explain to the most specific."""

    DTYPE = "dtype outside the IR"
    RUNTIME_SHAPE = "run-time shape input"
    CONVERSION = "conversion error"
    RUN = "run error"
    MISMATCH = "numeric mismatch"


def _ir_elem_types() -> frozenset[int]:
    """ONNX element types whose NumPy dtype the IR stores (proto/model.fbs DType)."""
    codes = set()
    for code in onnx.TensorProto.DataType.values():
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
        except (KeyError, TypeError, ValueError):
            continue
        if dtype in NUMPY_TO_IR or dtype.name in lowp.TYPES:  # ml_dtypes' types: lite/lowp.py
            codes.add(code)
    return frozenset(codes)


IR_ELEM_TYPES = _ir_elem_types()

# Converter messages that mean "this argument must be a constant, but the case feeds it
# as a graph input" (axes, pads, shapes, sizes, k, ...), and Loops whose trip count is one.
_RUNTIME_SHAPE_MESSAGES = re.compile(
    r"\((?:input \d+|inputs \d+ and \d+)\) must be static"
    r"|(?:input|k|axis|delta|values) (?:\(input \d+\) )?must be static"
    r"|shape input must be static"
    r"|need a trip count \(input M\) known at conversion"
)
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclass(frozen=True)
class Outcome:
    """One case's result: the op it tests, and why it fails (None when it passes)."""

    name: str
    op: str
    reason: Reason | None
    message: str = ""
    # For a run-time shape input failure: the outcome with those inputs made constants
    # ("passes", or the reason it still fails), a forecast for plan-time evaluation.
    as_constants: str = ""


def _value_types(values: Iterable[onnx.ValueInfoProto]) -> Iterator[int | str]:
    for value in values:
        kind = value.type.WhichOneof("value")
        if kind == "tensor_type":
            yield value.type.tensor_type.elem_type
        elif kind is not None:
            yield kind.removesuffix("_type")  # sequence, optional, map


def element_types(graph: onnx.GraphProto) -> set[int | str]:
    """Every element type a graph (and its subgraphs) declares or produces: values,
    initializers, Constant values and Cast targets; non-tensor values by kind name."""
    found: set[int | str] = set(_value_types([*graph.input, *graph.output, *graph.value_info]))
    found.update(t.data_type for t in graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                found.add(attr.t.data_type)
            elif attr.type == onnx.AttributeProto.GRAPH:
                found |= element_types(attr.g)
            elif node.op_type == "Cast" and attr.name == "to":
                found.add(attr.i)
    return found


def foreign_types(model: onnx.ModelProto) -> list[str]:
    """Names of the element types in `model` the IR cannot store, sorted."""
    names = set()
    for t in element_types(model.graph):
        if isinstance(t, str):
            names.add(t)
        elif t not in IR_ELEM_TYPES and t != onnx.TensorProto.UNDEFINED:
            names.add(onnx.TensorProto.DataType.Name(t).lower())
    return sorted(names)


def classify(error: str) -> Reason:
    """The reason class of a run_case error message (the dtype class is found statically)."""
    if _RUNTIME_SHAPE_MESSAGES.search(error):
        return Reason.RUNTIME_SHAPE
    if error.startswith("convert:"):
        return Reason.CONVERSION
    if error.startswith("run:"):
        return Reason.RUN
    return Reason.MISMATCH


def tested_op(name: str, model: onnx.ModelProto, ops_by_case: dict[str, str]) -> str:
    """The ONNX op a case is about: an _expanded case belongs to its unexpanded twin's op;
    otherwise the model's last non-Constant node."""
    twin = _EXPANDED.sub("", name)
    if twin != name and twin in ops_by_case:
        return ops_by_case[twin]
    nodes = [n for n in model.graph.node if n.op_type != "Constant"] or list(model.graph.node)
    return ob.op_key(nodes[-1]) if nodes else "(empty graph)"


def with_constant_arguments(case: ob.Case) -> ob.Case | None:
    """The case with every graph input but the first (every one, when the first is a
    scalar) turned into an initializer holding the first data set's value (None when the
    model has a single input)."""
    model, data_sets = case.load()  # type: ignore[operator]
    inits = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    if len(inputs) < 2 or not data_sets:
        return None
    values, expected = data_sets[0]
    kept = 0 if np.ndim(values[0]) == 0 else 1  # a scalar first input (Range's start) too
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    frozen.ir_version = max(frozen.ir_version, 4)  # initializers need not be inputs
    for value, array in zip(inputs[kept:], values[kept:], strict=False):
        frozen.graph.initializer.append(onnx.numpy_helper.from_array(array, value.name))
    fed = {v.name for v in inputs[:kept]}
    keep = [v for v in frozen.graph.input if v.name in fed or v.name in inits]
    del frozen.graph.input[:]
    frozen.graph.input.extend(keep)
    data = [(values[:kept], expected)]
    return ob.Case(case.name, case.kind, lambda: (frozen, data), case.rtol, case.atol, frozen)


def _run(case: ob.Case) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cases probe overflow and NaN on purpose
        return ob.run_case(case)


def run_all(pattern: str = "*") -> list[Outcome]:
    """Run every node case whose ops the converter claims; one Outcome per case."""
    cases = list(ob.iter_cases(("node",)))
    ops_by_case = {}
    for case in cases:
        assert case.model is not None
        nodes = [n for n in case.model.graph.node if n.op_type != "Constant"]
        if nodes:
            ops_by_case[case.name] = ob.op_key(nodes[-1])
    outcomes = []
    for case in cases:
        assert case.model is not None
        if not ob.fnmatch.fnmatchcase(case.name, pattern):
            continue
        if not all(ob.is_supported(op) for op in ob.case_ops(case.model)):
            continue
        op = tested_op(case.name, case.model, ops_by_case)
        foreign = foreign_types(case.model)
        if foreign:
            outcomes.append(Outcome(case.name, op, Reason.DTYPE, ", ".join(foreign)))
            continue
        error = _run(case)
        reason = None if error is None else classify(error)
        as_constants = ""
        if reason is Reason.RUNTIME_SHAPE:
            frozen = with_constant_arguments(case)
            if frozen is not None:
                again = _run(frozen)
                as_constants = "passes" if again is None else f"{classify(again)}: {again}"
        outcomes.append(Outcome(case.name, op, reason, error or "", as_constants))
    return outcomes


def _rate(passed: int, total: int) -> str:
    return f"{100 * passed / total:.1f}%" if total else "-"


def render(outcomes: list[Outcome]) -> str:
    """The Markdown report: totals, failure classes, the per-op table, every failure."""
    total = len(outcomes)
    passed = sum(o.reason is None for o in outcomes)
    in_ir = [o for o in outcomes if o.reason is not Reason.DTYPE]
    in_ir_passed = sum(o.reason is None for o in in_ir)
    reasons = Counter(o.reason for o in outcomes if o.reason is not None)
    lines = [
        "# ONNX backend node suite: conformance by op",
        "",
        "Generated by `python -m tests.conformance.report --write docs/conformance.md` with "
        f"onnx {onnx.__version__}. Every node case whose op types `sporenet-convert "
        "--list-ops` claims is converted, run by the lite Interpreter and compared with the "
        "suite's expected outputs at the suite's tolerances; none is skipped. An `_expanded` "
        "case (the op's ONNX function body) is counted under the op it expands.",
        "",
        f"- **All cases of claimed ops: {passed} / {total} passed ({_rate(passed, total)})**",
        f"- Cases whose tensors use only dtypes the IR stores: {in_ir_passed} / {len(in_ir)} "
        f"({_rate(in_ir_passed, len(in_ir))})",
        "",
        "## Failures by reason",
        "",
        "| reason | cases | meaning |",
        "|---|---:|---|",
    ]
    meaning = {
        Reason.DTYPE: "a value, Cast target or input is of a type proto/model.fbs cannot "
        "store (sequences, optionals, complex numbers)",
        Reason.RUNTIME_SHAPE: "an argument the planner needs (axes, pads, shape, sizes, "
        "scales, k, repeats, split, depth) is fed as a graph input at run time",
        Reason.CONVERSION: "the converter refuses an attribute, mode, rank or extra output",
        Reason.RUN: "the model converts but the Interpreter raises",
        Reason.MISMATCH: "outputs differ from the expected ones (values, shape or dtype)",
    }
    for reason in Reason:
        lines.append(f"| {reason} | {reasons.get(reason, 0)} | {meaning[reason]} |")
    runtime = [o for o in outcomes if o.reason is Reason.RUNTIME_SHAPE]
    forecast = sum(o.as_constants == "passes" for o in runtime)
    lines += [
        "",
        f"Of the {len(runtime)} run-time shape input cases, {forecast} pass when their "
        "inputs after the first are given as constants (the first data set's values): the "
        "kernels are ready for them once such inputs are evaluated when the model is planned. "
        f"With them the totals would be {passed + forecast} / {total} "
        f"({_rate(passed + forecast, total)}) and {in_ir_passed + forecast} / {len(in_ir)} "
        f"({_rate(in_ir_passed + forecast, len(in_ir))}) in the IR's dtypes.",
    ]
    foreign = Counter(
        t for o in outcomes if o.reason is Reason.DTYPE for t in o.message.split(", ")
    )
    lines += [
        "",
        "Types outside the IR, by cases that use them: "
        + ", ".join(f"{t} {n}" for t, n in sorted(foreign.items(), key=lambda kv: -kv[1])),
        "",
        "## By op",
        "",
        "| op | cases | passed | rate | " + " | ".join(r.value for r in Reason) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(Reason),
    ]
    by_op: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_op.setdefault(o.op, []).append(o)
    for op in sorted(by_op, key=str.lower):
        group = by_op[op]
        ok = sum(o.reason is None for o in group)
        counts = Counter(o.reason for o in group)
        cells = " | ".join(str(counts.get(r, "")) for r in Reason)
        lines.append(f"| {op} | {len(group)} | {ok} | {_rate(ok, len(group))} | {cells} |")
    lines += ["", "## Every failing case", ""]
    for reason in Reason:
        failing = [o for o in outcomes if o.reason is reason]
        if not failing:
            continue
        lines += [f"### {reason} ({len(failing)})", ""]
        for o in failing:
            note = f" (as constants: {o.as_constants})" if o.as_constants else ""
            lines.append(f"- `{o.name}`: {o.message}{note}".replace("|", "/"))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="*", help="only cases matching this glob")
    parser.add_argument("--write", metavar="PATH", help="write the Markdown report here")
    args = parser.parse_args(argv)
    outcomes = run_all(args.pattern)
    report = render(outcomes)
    if args.write:  # only the ONNX section: the TFLite one is tflite_report.py's
        sections.write_section(Path(args.write), BEGIN, END, report)
    summary = report.split("## By op")[0]
    print(summary.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
