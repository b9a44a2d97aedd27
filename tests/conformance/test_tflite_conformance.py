"""The TFLite conformance suite under pytest: every generated case of a claimed op, run by
LiteRT's reference kernels and by sporenet, must agree (tflite_suite.py says how).

Known failures are strict xfails with their reasons (tflite_known.py). Cases of ops
`supported_tflite_ops()` does not claim are not collected: the report (tflite_report.py)
counts them as unsupported.
"""

from __future__ import annotations

import pytest

from sporenet.converter import supported_tflite_ops
from tests.conformance.tflite_cases import cases
from tests.conformance.tflite_known import KNOWN_FAILURES

pytest.importorskip("ai_edge_litert.interpreter", reason="LiteRT (test extra) is the reference")

from tests.conformance.tflite_suite import Result, build, run_case, run_litert

CLAIMED = frozenset(supported_tflite_ops())


def _params() -> list:
    params = []
    for case in cases():
        if case.op not in CLAIMED:
            continue
        marks = [pytest.mark.slow] if case.slow else []
        if case.name in KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(reason=KNOWN_FAILURES[case.name], strict=True))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_tflite_case_matches_litert(case) -> None:
    outcome = run_case(case, CLAIMED)
    assert outcome.result is not Result.INVALID, f"the generator is wrong: {outcome.message}"
    assert outcome.result is Result.PASSED, f"{outcome.result.value}: {outcome.message}"


def test_known_failures_name_generated_cases() -> None:
    names = {case.name for case in cases()}
    assert set(KNOWN_FAILURES) <= names, sorted(set(KNOWN_FAILURES) - names)


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.name) for c in cases() if c.op not in CLAIMED and not c.slow]
)
def test_unclaimed_cases_are_valid_litert_models(case) -> None:
    """Cases of ops not claimed yet still run in LiteRT, so they count once a handler
    lands (the generator, not sporenet, is checked here)."""
    data, feeds = build(case)
    assert run_litert(data, feeds)


def test_the_report_replaces_only_its_section(tmp_path) -> None:
    from tests.conformance.tflite_report import BEGIN, END, write_section

    path = tmp_path / "conformance.md"
    path.write_text("# ONNX\n\nonnx table\n")
    write_section(path, f"{BEGIN}\nfirst\n{END}\n")
    write_section(path, f"{BEGIN}\nsecond\n{END}\n")
    text = path.read_text()
    assert text.startswith("# ONNX\n\nonnx table\n")
    assert "second" in text and "first" not in text and text.count(BEGIN) == 1
