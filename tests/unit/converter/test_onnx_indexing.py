"""GatherND, GatherElements, ScatterND and ScatterElements against onnxruntime: batch axes,
negative indices, every reduction with duplicate positions, and dynamic shapes."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import Interpreter
from sporenet.lite.errors import InputError
from tests.unit.converter.helpers import (
    TensorProto,
    assert_matches_ort,
    convert,
    convert_onnx,
    helper,
    make_model,
    op_names,
)

_I64 = TensorProto.INT64


def _rand(*shape: int) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(shape).astype(np.float32)


def test_gather_nd_with_batch_axes_and_negative_indices() -> None:
    data = _rand(2, 3, 4, 5)
    rng = np.random.default_rng(1)
    # batch_dims 2: each [k] row indexes data[b0, b1] (shape [4, 5]) from either end.
    idx = np.stack([rng.integers(-4, 4, (2, 3, 6)), rng.integers(-5, 5, (2, 3, 6))], -1)
    node = helper.make_node("GatherND", ["data", "idx"], ["y"], batch_dims=2)
    model = make_model(
        [node], {"data": [2, 3, 4, 5], "idx": [2, 3, 6, 2]}, ["y"], input_dtypes={"idx": _I64}
    )
    assert_matches_ort(model, {"data": data, "idx": idx.astype(np.int64)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_every_reduction_on_a_dynamic_batch(reduction: str) -> None:
    data = _rand(5, 3)
    # Duplicate rows only where the reduction defines their result.
    rows = [[4], [0], [-1]] if reduction == "none" else [[4], [0], [-1], [0]]
    idx = np.array(rows, np.int64)
    updates = _rand(len(rows), 3) + 2
    node = helper.make_node("ScatterND", ["data", "idx", "u"], ["y"], reduction=reduction)
    model = make_model(
        [node],
        {"data": ["n", 3], "idx": [len(rows), 1], "u": [len(rows), 3]},
        ["y"],
        opset=18,
        input_dtypes={"idx": _I64},
    )
    assert_matches_ort(model, {"data": data, "idx": idx, "u": updates})


@pytest.mark.parametrize("reduction", ["add", "max"])
def test_scatter_elements_with_duplicates_and_shorter_indices(reduction: str) -> None:
    data = _rand(3, 4)
    idx = np.array([[0, -1, 0], [3, 3, 1]], np.int64)  # [2, 3] into [3, 4] along the last axis
    node = helper.make_node(
        "ScatterElements", ["data", "idx", "u"], ["y"], axis=-1, reduction=reduction
    )
    model = make_model(
        [node],
        {"data": [3, 4], "idx": [2, 3], "u": [2, 3]},
        ["y"],
        opset=18,
        input_dtypes={"idx": _I64},
    )
    assert_matches_ort(model, {"data": data, "idx": idx, "u": _rand(2, 3)})


def test_gather_elements_on_a_dynamic_axis() -> None:
    data = _rand(4, 6)
    idx = np.random.default_rng(2).integers(-4, 4, (3, 6)).astype(np.int64)
    node = helper.make_node("GatherElements", ["data", "idx"], ["y"], axis=0)
    model = make_model(
        [node], {"data": ["n", 6], "idx": ["m", 6]}, ["y"], input_dtypes={"idx": _I64}
    )
    assert_matches_ort(model, {"data": data, "idx": idx})


def test_an_index_out_of_range_is_an_input_error() -> None:
    node = helper.make_node("ScatterND", ["data", "idx", "u"], ["y"])
    model = make_model(
        [node], {"data": [5, 3], "idx": [1, 1], "u": [1, 3]}, ["y"], input_dtypes={"idx": _I64}
    )
    interpreter = Interpreter(model_content=convert_onnx(model))
    feeds = {"data": _rand(5, 3), "idx": np.array([[5]], np.int64), "u": _rand(1, 3)}
    with pytest.raises(InputError, match="outside the data's shape"):
        interpreter.run(feeds)


def test_gather_nd_of_one_axis_wraps_and_refuses_out_of_range_rows() -> None:
    # One index axis and no batch axes take rows with np.take (gather_nd._bind_take):
    # negative rows count from the end as onnxruntime's do; one past either end is an
    # error when the graph runs, not a clipped row.
    data = _rand(6, 4)
    node = helper.make_node("GatherND", ["data", "idx"], ["y"])
    model = make_model([node], {"data": [6, 4], "idx": [5, 1]}, ["y"], input_dtypes={"idx": _I64})
    idx = np.array([[0], [5], [-1], [-6], [2]], np.int64)
    assert_matches_ort(model, {"data": data, "idx": idx})
    interpreter = Interpreter(model_content=convert_onnx(model))
    for bad in (6, -7):
        idx[1, 0] = bad
        with pytest.raises(InputError, match="outside"):
            interpreter.run({"data": data, "idx": idx})


def _row_scatter_model(reduction: str, dtype: int = TensorProto.FLOAT) -> object:
    # PyTorch's index.unsqueeze(-1).expand_as(messages) then scatter_reduce along axis 0,
    # with the number of edges and nodes dynamic, as a graph network exports it.
    nodes = [
        helper.make_node("Unsqueeze", ["col", "axes"], ["col2"]),
        helper.make_node("Shape", ["u"], ["shape"]),
        helper.make_node("Expand", ["col2", "shape"], ["idx"]),
        helper.make_node(
            "ScatterElements", ["data", "idx", "u"], ["y"], axis=0, reduction=reduction
        ),
    ]
    return make_model(
        nodes,
        {"data": ["n", 5], "col": ["e"], "u": ["e", 5]},
        ["y"],
        initializers={"axes": np.array([-1], np.int64)},
        opset=18,
        input_dtypes={"col": _I64, "data": dtype, "u": dtype},
    )


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_row_scatter_elements_become_row_scatters(reduction: str) -> None:
    # converter/passes/row_scatters.py: the same results as onnxruntime's ScatterElements,
    # duplicates and negative rows included, at small and large (row, edge) counts (the
    # one-hot product and the positions' path of kernels/scatter._bind_rows).
    model = _row_scatter_model(reduction)
    assert "SCATTER_ND_UPDATE" in op_names(convert(model))
    rng = np.random.default_rng(5)
    for n, e in ((4, 7), (300, 90)):
        col = rng.integers(-n, n, e).astype(np.int64)
        if reduction == "none":  # duplicate rows only where the reduction defines them
            col = rng.permutation(np.arange(-n, n))[:e] if 2 * n >= e else col
            col = np.unique(col % n)[: min(e, n)]
        u = rng.standard_normal((col.size, 5)).astype(np.float32)
        feeds = {"data": _rand(n, 5), "col": col, "u": u}
        assert_matches_ort(model, feeds)


def test_row_scatter_add_keeps_infinities_in_their_rows() -> None:
    # A product with a one-hot matrix would spread an infinite update into every row
    # (0 * inf): such updates take the positions' path.
    model = _row_scatter_model("add")
    u = np.ones((3, 5), np.float32)
    u[1, 2] = np.inf
    feeds = {"data": _rand(4, 5), "col": np.array([0, 2, 2], np.int64), "u": u}
    assert_matches_ort(model, feeds)
