"""The warm-up at load (lite/warmup.py): it runs every branch a call can take, ends on
loops that zeros would never end, stays silent, respects its budget and leaves state
alone."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sporenet.lite import Interpreter, ModelBuilder, OpCode, parse, serialize
from sporenet.lite.kernels.training.dropout import step_generator
from sporenet.lite.planner import plan
from sporenet.lite.warmup import warm_up, writes_state
from tests.unit.converter.helpers import (
    TensorProto,
    assert_matches_ort,
    convert_onnx,
    helper,
    make_model,
    subgraph,
)

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _if_taken_only_when_true() -> bytes:
    """y = c ? max(x - 1) : sum(reshape(x, [2, 2])); the else branch cannot run for x of 3
    elements, and zero inputs (c = False) take it."""
    then = subgraph(
        [
            helper.make_node("Sub", ["x", "one"], ["d"]),
            helper.make_node("ReduceMax", ["d"], ["t"], keepdims=0),
        ],
        "then",
        [("t", F, [])],
    )
    other = subgraph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("ReduceSum", ["r"], ["e"], keepdims=0),
        ],
        "else",
        [("e", F, [])],
    )
    model = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        {"c": [], "x": [3]},
        ["y"],
        input_dtypes={"c": B},
        initializers={"shape": np.array([2, 2], np.int64), "one": np.ones((), np.float32)},
        output_shapes={"y": []},
    )
    return convert_onnx(model)


def test_an_if_branch_zeros_do_not_take_is_warmed_through_the_if() -> None:
    model = parse(_if_taken_only_when_true())
    planned = plan(model)
    y = planned.arrays[planned.outputs[0]]
    y.fill(7.0)
    warm_up(planned)
    # The If's own output holds the then branch's result on zeros, max(0 - 1), although
    # the step on zero inputs (c = False) stops at the else branch.
    assert y == -1.0
    x = np.array([1.0, 5.0, 2.0], np.float32)
    interpreter = Interpreter(model_content=_if_taken_only_when_true())
    assert interpreter.run({"c": np.array(True), "x": x})["y"] == 4.0


def test_no_warm_up_runs_past_its_budget() -> None:
    planned = plan(parse(_if_taken_only_when_true()))
    y = planned.arrays[planned.outputs[0]]
    y.fill(7.0)
    warm_up(planned, budget=-1.0)  # spent before it starts
    assert y == 7.0


def _while_sum_below_limit() -> object:
    """s += x * i while sum(s) < 40, with no trip count: on zero inputs it never ends."""
    body = subgraph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
            helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["c_out"]),
        ],
        "body",
        [("c_out", B, []), ("s_out", F, [3])],
        inputs=[
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", B, []),
            helper.make_tensor_value_info("s_in", F, [3]),
        ],
    )
    return make_model(
        [helper.make_node("Loop", ["", "", "s0"], ["s"], body=body)],
        {"x": [3], "s0": [3]},
        ["s"],
        initializers={"limit": np.array(40.0, np.float32)},
        output_shapes={"s": [3]},
    )


def test_a_loop_zeros_would_never_end_is_not_run_at_load() -> None:
    # Loading (which warms up) must return; then the loop runs as onnxruntime's does.
    feeds = {"x": np.array([1.0, -0.5, 2.0], np.float32), "s0": np.zeros(3, np.float32)}
    want = assert_matches_ort(_while_sum_below_limit(), feeds)
    assert want[0].sum() >= 40.0


def test_the_warm_up_on_zeros_raises_no_numpy_warning() -> None:
    """log(0) and 1 / 0 on the zero inputs: no RuntimeWarning at load."""
    model = make_model(
        [
            helper.make_node("Log", ["x"], ["l"]),
            helper.make_node("Div", ["one", "x"], ["r"]),
            helper.make_node("Add", ["l", "r"], ["y"]),
        ],
        {"x": [4]},
        ["y"],
        initializers={"one": np.ones((), np.float32)},
    )
    data = convert_onnx(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interpreter = Interpreter(model_content=data)
    x = np.array([0.5, 1.0, 2.0, 4.0], np.float32)
    np.testing.assert_allclose(interpreter.run({"x": x})["y"], np.log(x) + 1 / x, rtol=1e-6)


def test_a_model_that_writes_state_is_not_warmed() -> None:
    """A training-mode dropout advances its step counter on every run: the first call
    after load must draw the masks of step 0."""
    b = ModelBuilder()
    x = b.input("x", (2, 64))
    b.output(b.op(OpCode.DROPOUT, [x], ratio=0.5, training=1, seed=3), "y")
    model = b.build()
    assert writes_state(model)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)}
    got = Interpreter(model_content=serialize(model)).run(feeds)["y"]
    uniform = step_generator(3, 0).random((2, 64), dtype=np.float32)
    np.testing.assert_allclose(got, feeds["x"] * (uniform >= 0.5) * 2.0, rtol=1e-6)


@pytest.mark.parametrize("explicit", [False, True])
def test_warm_up_leaves_the_first_call_exact(explicit: bool) -> None:
    """After the load's warm-up (and another from allocate_tensors), the first call gives
    what a plan never warmed gives."""
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", (3, 8))
    w = b.constant("w", rng.standard_normal((5, 8)), np.float32)
    h = b.op(OpCode.FULLY_CONNECTED, [x, w])
    b.output(b.op(OpCode.SOFTMAX, [b.op(OpCode.TANH, [h])]), "y")
    data = serialize(b.build())
    feeds = {"x": rng.standard_normal((3, 8)).astype(np.float32)}
    cold = plan(parse(data))
    np.copyto(cold.arrays[cold.inputs[0]], feeds["x"])
    cold.run()
    interpreter = Interpreter(model_content=data)
    if explicit:
        interpreter.allocate_tensors()
    np.testing.assert_array_equal(interpreter.run(feeds)["y"], cold.arrays[cold.outputs[0]])
