"""Exception types of the converter: what the `sporenet-convert` command reports on failure."""

from __future__ import annotations

from collections.abc import Mapping


class ConversionError(Exception):
    """A model could not be converted (the message says which node or tensor and why)."""


class CalibrationError(ConversionError):
    """Calibration data do not fit the model's inputs (the message names the input)."""


class InvalidOnnxError(ConversionError):
    """The input is not a readable ONNX model: wrong format, truncated, or missing data files."""


class UnsupportedOnnxOpError(ConversionError):
    """The model uses ONNX op types the converter cannot import; all of them are listed."""

    def __init__(self, ops: Mapping[str, int]) -> None:
        self.ops = dict(sorted(ops.items()))
        listed = ", ".join(f"{name} (x{count})" for name, count in self.ops.items())
        total = sum(self.ops.values())
        super().__init__(
            f"{len(self.ops)} unsupported ONNX op type(s) in {total} node(s): {listed}. "
            "Run `sporenet-convert --list-ops` to see every op type the converter accepts."
        )
