"""Typed errors for inputs that are not convertible: never a traceback from deep inside."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sporenet.converter import (
    ConversionError,
    InvalidOnnxError,
    UnsupportedOnnxOpError,
    convert_onnx,
    supported_onnx_ops,
)
from tests.unit.converter.helpers import helper, make_model, onnx


def small_model() -> object:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2, 3]}, ["y"])


def test_not_onnx_bytes(tmp_path: Path) -> None:
    for data in (b"", b"hello world, not a protobuf" * 10, b'{"json": true}'):
        with pytest.raises(InvalidOnnxError, match="not a valid ONNX model"):
            convert_onnx(data)


def test_a_spore_file_is_named(tmp_path: Path) -> None:
    spore = convert_onnx(small_model())
    with pytest.raises(InvalidOnnxError, match=r"sporenet \.spore model"):
        convert_onnx(spore)


def test_truncated_protobuf(tmp_path: Path) -> None:
    model = make_model(
        [helper.make_node("Gemm", ["x", "W"], ["y"], transB=1)],
        {"x": [2, 64]},
        ["y"],
        initializers={"W": np.ones((64, 64), np.float32)},
    )
    path = tmp_path / "model.onnx"
    data = model.SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidOnnxError, match=str(path.name)):
        convert_onnx(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidOnnxError, match="no such file"):
        convert_onnx(tmp_path / "absent.onnx")


def test_external_data_missing_and_present(tmp_path: Path) -> None:
    w = np.arange(4096, dtype=np.float32).reshape(64, 64)
    model = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        {"x": [2, 64]},
        ["y"],
        initializers={"W": w},
    )
    path = tmp_path / "big.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="big.weights",
        size_threshold=0,
    )
    x = np.ones((2, 64), np.float32)
    # Present: converts, and the weights are the external file's bytes.
    from sporenet.lite import Interpreter

    out = Interpreter(model_content=convert_onnx(path)).run({"x": x})["y"]
    np.testing.assert_allclose(out, x @ w, rtol=1e-6)
    # From bytes there is no directory to find the data in.
    with pytest.raises(InvalidOnnxError, match="external files"):
        convert_onnx(path.read_bytes())
    (tmp_path / "big.weights").unlink()
    with pytest.raises(InvalidOnnxError, match=r"missing external-data file.*big\.weights"):
        convert_onnx(path)


def test_unsupported_ops_are_listed_all_at_once_with_counts() -> None:
    nodes = [
        helper.make_node("Sin", ["x"], ["a"]),
        helper.make_node("Cos", ["a"], ["b"]),
        helper.make_node("Sin", ["b"], ["c"]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 3]}, ["y"])
    with pytest.raises(UnsupportedOnnxOpError) as info:
        convert_onnx(model)
    assert info.value.ops == {"Cos": 1, "Sin": 2}
    message = str(info.value)
    assert "Cos (x1)" in message and "Sin (x2)" in message and "--list-ops" in message
    assert "Sin" not in supported_onnx_ops() and "Relu" in supported_onnx_ops()


def test_custom_domain_ops_are_unsupported() -> None:
    node = helper.make_node("Relu", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, [2])],
        [helper.make_tensor_value_info("y", 1, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    )
    with pytest.raises(UnsupportedOnnxOpError, match=r"com\.example\.Relu \(x1\)"):
        convert_onnx(model)


def test_input_shape_errors() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["N", 3]}, ["y"])
    with pytest.raises(ConversionError, match="not model inputs"):
        convert_onnx(model, input_shapes={"nope": (1, 3)})
    with pytest.raises(ConversionError, match="does not fit the declared shape"):
        convert_onnx(model, input_shapes={"x": (2, 4)})


def test_unstorable_dtype_is_named() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        {"x": [2]},
        ["y"],
        input_dtypes={"x": onnx.TensorProto.COMPLEX128},
    )
    with pytest.raises(ConversionError, match="COMPLEX128"):
        convert_onnx(model)


def test_bad_argument_type() -> None:
    with pytest.raises(TypeError, match=r"path, bytes or onnx\.ModelProto"):
        convert_onnx(3.5)  # type: ignore[arg-type]


def test_huge_constant_of_shape_is_refused_without_allocating() -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("Add", ["x", "big"], ["y"]),
    ]
    model = make_model(
        nodes,
        {"x": [1]},
        ["y"],
        output_shapes={"y": [1]},
        initializers={"shape": np.array([1 << 20, 1 << 20], np.int64)},
    )
    with pytest.raises(ConversionError, match="more than the"):
        convert_onnx(model)
