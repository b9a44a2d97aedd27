"""The conformance suites need onnx (the converter's extra); skip them without it."""

import pytest

pytest.importorskip("onnx", reason="the conformance suites need the onnx extra")
