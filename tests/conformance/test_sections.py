"""The ONNX and TFLite report writers each replace only their own section of
docs/conformance.md."""

from __future__ import annotations

from tests.conformance import report, tflite_report
from tests.conformance.sections import write_section


def test_each_writer_keeps_the_other_section(tmp_path) -> None:
    path = tmp_path / "conformance.md"
    write_section(path, report.BEGIN, report.END, "# ONNX\n\nfirst onnx\n")
    tflite_report.write_section(path, f"{tflite_report.BEGIN}\n# TFLite v1\n{tflite_report.END}\n")
    write_section(path, report.BEGIN, report.END, "# ONNX\n\nsecond onnx\n")
    tflite_report.write_section(path, f"{tflite_report.BEGIN}\n# TFLite v2\n{tflite_report.END}\n")
    text = path.read_text()
    assert "second onnx" in text and "TFLite v2" in text
    assert "first onnx" not in text and "TFLite v1" not in text
    assert text.count(report.BEGIN) == text.count(tflite_report.BEGIN) == 1
    assert text.index(report.END) < text.index(tflite_report.BEGIN)
