"""Shape-like values fed as graph inputs (a Reshape target, Expand's shape, Tile's repeats,
Resize's sizes, Range's bounds, Slice's starts/ends, axes): the runtime plans with their
values and re-plans when they change, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import ConversionError, convert_onnx
from sporenet.lite import Interpreter
from sporenet.lite.errors import InputError
from tests.unit.converter.helpers import TensorProto, helper, make_model, run_ort

RNG = np.random.default_rng(11)
I64 = TensorProto.INT64


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


CASES = {
    "reshape": (
        "Reshape",
        {"x": [2, 3, 4], "shape": [3]},
        {"shape": I64},
        [{"x": rand(2, 3, 4), "shape": i64(4, 3, 2)}, {"x": rand(2, 3, 4), "shape": i64(0, -1, 1)}],
        {},
    ),
    "expand": (
        "Expand",
        {"x": [3, 1], "shape": [2]},
        {"shape": I64},
        [{"x": rand(3, 1), "shape": i64(3, 4)}, {"x": rand(3, 1), "shape": i64(1, 6)}],
        {},
    ),
    "tile": (
        "Tile",
        {"x": [2, 3], "repeats": [2]},
        {"repeats": I64},
        [{"x": rand(2, 3), "repeats": i64(2, 1)}, {"x": rand(2, 3), "repeats": i64(1, 3)}],
        {},
    ),
    "unsqueeze": (
        "Unsqueeze",
        {"x": [2, 3], "axes": [1]},
        {"axes": I64},
        [{"x": rand(2, 3), "axes": i64(0)}, {"x": rand(2, 3), "axes": i64(-1)}],
        {},
    ),
    "slice": (
        "Slice",
        {"x": [6, 5], "starts": [1], "ends": [1]},
        {"starts": I64, "ends": I64},
        [
            {"x": rand(6, 5), "starts": i64(1), "ends": i64(4)},
            {"x": rand(6, 5), "starts": i64(-2), "ends": i64(100)},
        ],
        {},
    ),
    "resize-sizes": (
        "Resize",
        {"x": [1, 1, 3, 4], "roi": [0], "scales": [0], "sizes": [4]},
        {"sizes": I64},
        [
            {"x": rand(1, 1, 3, 4), "sizes": i64(1, 1, 6, 8)},
            {"x": rand(1, 1, 3, 4), "sizes": i64(1, 1, 5, 3)},
        ],
        {"mode": "nearest"},
    ),
    "range": (
        "Range",
        {"start": [], "limit": [], "delta": []},
        {"start": I64, "limit": I64, "delta": I64},
        [
            {"start": i64(1)[0], "limit": i64(10)[0], "delta": i64(3)[0]},
            {"start": i64(5)[0], "limit": i64(-2)[0], "delta": i64(-1)[0]},
        ],
        {},
    ),
}


def _model(op: str, inputs: dict, dtypes: dict, attrs: dict) -> object:
    feeds = list(inputs)
    if op == "Resize":
        # roi and scales are absent: only sizes is fed.
        node = helper.make_node(op, ["x", "", "", "sizes"], ["y"], **attrs)
        inputs = {"x": inputs["x"], "sizes": inputs["sizes"]}
    else:
        node = helper.make_node(op, feeds, ["y"], **attrs)
    out_dtype = I64 if op == "Range" else TensorProto.FLOAT
    rank = {"Reshape": 3, "Unsqueeze": 3, "Resize": 4, "Range": 1}.get(op, 2)
    graph = helper.make_graph(
        [node],
        "shape-input",
        [
            helper.make_tensor_value_info(n, dtypes.get(n, TensorProto.FLOAT), shape)
            for n, shape in inputs.items()
        ],
        [helper.make_tensor_value_info("y", out_dtype, [f"d{k}" for k in range(rank)])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_shape_input_is_planned_from_its_value(case: str) -> None:
    op, inputs, dtypes, runs, attrs = CASES[case]
    model = _model(op, inputs, dtypes, attrs)
    interpreter = Interpreter(model_content=convert_onnx(model))
    for feeds in runs:
        feeds = {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}}
        (want,) = run_ort(model, {k: np.asarray(v) for k, v in feeds.items()})
        got = interpreter.run(feeds)["y"]
        assert got.shape == want.shape, (feeds, got.shape, want.shape)
        np.testing.assert_array_equal(got, want)


def test_set_tensor_and_invoke_replan_when_the_value_changes() -> None:
    op, inputs, dtypes, _, attrs = CASES["reshape"]
    interpreter = Interpreter(model_content=convert_onnx(_model(op, inputs, dtypes, attrs)))
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    out = interpreter.get_output_details()[0]["index"]
    x = rand(2, 3, 4)
    with pytest.raises(InputError, match="'shape'"):
        interpreter.set_tensor(index["x"], x)
        interpreter.invoke()
    for target in ((4, 6), (24,), (2, 2, 6)):
        interpreter.set_tensor(index["x"], x)
        interpreter.set_tensor(
            index["shape"],
            i64(*target, *([1] * (3 - len(target)))),
        )
        interpreter.invoke()
        np.testing.assert_array_equal(
            interpreter.get_tensor(out), x.reshape(*target, *([1] * (3 - len(target))))
        )


def test_ops_after_a_fed_shape_are_planned_at_run_time_too() -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["c"]),
        helper.make_node("Cast", ["c"], ["y"], to=TensorProto.DOUBLE),
    ]
    graph = helper.make_graph(
        nodes,
        "after-fed-shape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", I64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["a", "b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    interpreter = Interpreter(model_content=convert_onnx(model))
    x = rand(2, 3)
    for target in ((3, 2), (1, 6)):
        got = interpreter.run({"x": x, "shape": i64(*target)})["y"]
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, np.maximum(x, 0).reshape(target).astype(np.float64))


def test_a_fed_shape_read_by_an_op_needing_its_shape_is_refused_clearly() -> None:
    model = make_model(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Shape", ["r"], ["y"]),
        ],
        {"x": [2, 3], "shape": [2]},
        ["y"],
        input_dtypes={"shape": I64},
        opset=13,
    )
    with pytest.raises(ConversionError, match="depends on the value of an input fed at run time"):
        convert_onnx(model)
