"""The conformance report counts every case of a claimed op and classifies each failure."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from tests.conformance import report


def _model(elem_type: int, cast_to: int | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", elem_type, [2])
    y = helper.make_tensor_value_info("y", cast_to or elem_type, [2])
    node = (
        helper.make_node("Cast", ["x"], ["y"], to=cast_to)
        if cast_to is not None
        else helper.make_node("Relu", ["x"], ["y"])
    )
    return helper.make_model(helper.make_graph([node], "g", [x], [y]))


def test_foreign_types_finds_inputs_and_cast_targets() -> None:
    assert report.foreign_types(_model(TensorProto.FLOAT)) == []
    # complex64 is the IR's (TFLite's RFFT2D), complex128 is not
    assert report.foreign_types(_model(TensorProto.COMPLEX64)) == []
    assert report.foreign_types(_model(TensorProto.FLOAT, TensorProto.COMPLEX128)) == ["complex128"]
    # the low-precision types are the IR's (lite/lowp.py)
    assert report.foreign_types(_model(TensorProto.BFLOAT16, TensorProto.FLOAT8E5M2)) == []


def test_classify_by_message() -> None:
    runtime = "convert: ConversionError: node 'y' (ReduceSum): axes (input 1) must be static"
    assert report.classify(runtime) is report.Reason.RUNTIME_SHAPE
    trilu = "convert: ConversionError: node 'y' (Trilu): k (input 1) must be static"
    assert report.classify(trilu) is report.Reason.RUNTIME_SHAPE
    mode = "convert: ConversionError: node 'Y' (Resize): mode 'cubic' is not supported"
    assert report.classify(mode) is report.Reason.CONVERSION
    training = "convert: ConversionError: node 'y' (Dropout): training_mode must be static"
    assert report.classify(training) is report.Reason.CONVERSION
    assert report.classify("run: ShapeError: bad") is report.Reason.RUN
    assert report.classify("output 'y': values differ") is report.Reason.MISMATCH


def test_every_case_of_an_op_is_counted() -> None:
    """Add's cases include its uint16/32/64 variants; none is skipped."""
    outcomes = report.run_all("test_add*")
    names = {o.name for o in outcomes}
    assert {"test_add", "test_add_bcast", "test_add_uint8", "test_add_uint16"} <= names
    assert all(o.op == "Add" for o in outcomes)
    by_name = {o.name: o for o in outcomes}
    assert by_name["test_add"].reason is None
    text = report.render(outcomes)
    assert f"| Add | {len(outcomes)} |" in text
