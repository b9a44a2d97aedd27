"""Tensor data read in place (onnx_import/in_place.py) and the checker asked only when an
import fails (onnx_import/loader.py)."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import InvalidOnnxError, convert_onnx
from sporenet.converter.convert import convert_onnx_model
from sporenet.converter.onnx_import.in_place import (
    WireError,
    in_place_span,
    split_in_place,
    tensor_value,
)
from tests.unit.converter.helpers import TensorProto, helper, make_model, numpy_helper, onnx

F = TensorProto.FLOAT


def _model_with_every_kind_of_tensor() -> onnx.ModelProto:
    """Weights as a raw_data initializer, a float_data Constant, a small initializer, and an
    If whose branches hold a Constant of their own."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    c_value = helper.make_tensor("c", F, [16], rng.standard_normal(16).tolist())  # float_data
    big = helper.make_tensor("k", F, [8, 16], rng.standard_normal(128).tolist())
    branch_const = helper.make_node(
        "Constant", [], ["k_out"], value=helper.make_tensor("kt", F, [16], np.ones(16).tolist())
    )
    then = helper.make_graph(
        [branch_const, helper.make_node("Add", ["h", "k_out"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2, 16])],
    )
    other = helper.make_graph(
        [helper.make_node("Sub", ["h", "b"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", F, [2, 16])],
    )
    nodes = [
        helper.make_node("Constant", [], ["c"], value=c_value),
        helper.make_node("Constant", [], ["k"], value=big),
        helper.make_node("Gemm", ["x", "w"], ["m"], transB=1),
        helper.make_node("Add", ["m", "c"], ["a"]),
        helper.make_node("Add", ["a", "b"], ["h"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
    ]
    return make_model(
        nodes,
        {"x": [2, 16], "cond": []},
        ["y"],
        input_dtypes={"cond": TensorProto.BOOL},
        initializers={"w": w, "b": numpy_helper.to_array(b)},
        output_shapes={"y": [2, 16]},
    )


def _all_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    from onnx import external_data_helper

    return list(external_data_helper._get_all_tensors(model))


def test_split_keeps_every_value_and_leaves_the_weights_in_the_bytes() -> None:
    model = _model_with_every_kind_of_tensor()
    data = model.SerializeToString()
    stripped = split_in_place(memoryview(data))
    assert stripped is not None and len(stripped) < len(data) // 2
    parsed = onnx.ModelProto()
    parsed.ParseFromString(stripped)
    pairs = list(zip(_all_tensors(model), _all_tensors(parsed), strict=True))
    in_place = [b for _, b in pairs if in_place_span(b) is not None]
    assert len(in_place) == 2  # w (raw_data) and k (float_data, 512 bytes); the rest is small
    for original, read in pairs:
        want = numpy_helper.to_array(original)
        got = tensor_value(read, memoryview(data))
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert [n.op_type for n in parsed.graph.node] == [n.op_type for n in model.graph.node]


def test_bytes_that_are_not_a_model_are_refused_by_the_scan() -> None:
    with pytest.raises(WireError):
        split_in_place(memoryview(b"\x0f\x01\x02"))  # wire type 7 does not exist


def test_a_converted_file_equals_the_conversion_of_the_parsed_model(tmp_path: Path) -> None:
    model = _model_with_every_kind_of_tensor()
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert convert_onnx(path) == convert_onnx(model)
    assert convert_onnx(path.read_bytes()) == convert_onnx(model)


def test_weights_are_views_of_the_mapped_file(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(_model_with_every_kind_of_tensor().SerializeToString())
    ir, _ = convert_onnx_model(path, optimize=False)
    (w,) = [t.data for t in ir.tensors if t.name == "w"]
    base = w
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    assert isinstance(base, mmap.mmap)
    assert not w.flags.writeable


def test_a_short_raw_data_is_named_by_the_checker() -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        {"x": [64, 64]},
        ["y"],
        initializers={"w": np.ones((64, 64), np.float32)},
    )
    model.graph.initializer[0].raw_data = b"\0" * 1024  # 4096 floats declared
    with pytest.raises(InvalidOnnxError, match=r"checker rejects the model.*raw_data size"):
        convert_onnx(model.SerializeToString())


def test_a_value_named_twice_is_invalid_onnx() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("y", F, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidOnnxError, match="single static assignment"):
        convert_onnx(model)


def test_a_node_missing_an_input_is_invalid_onnx() -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidOnnxError, match=r"checker rejects the model.*input size 1"):
        convert_onnx(model)
