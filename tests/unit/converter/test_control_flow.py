"""If and Loop: ONNX subgraphs converted into IR subgraphs, run against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_onnx
from sporenet.converter.errors import ConversionError
from sporenet.lite.errors import ModelFormatError
from sporenet.lite.ops import OpCode
from tests.unit.converter.helpers import (
    TensorProto,
    assert_matches_ort,
    convert,
    helper,
    make_model,
    subgraph,
)

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _if_model(*, nested: bool = False):
    """y = cond ? relu(x) * w : x - 1, where the branches read the outer x and w."""
    then = subgraph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t_out"])],
        "then",
        [("t_out", F, [2, 3])],
    )
    if nested:
        inner_then = subgraph(
            [helper.make_node("Sub", ["x", "one"], ["it_out"])],
            "inner_then",
            [("it_out", F, [2, 3])],
        )
        inner_else = subgraph(
            [helper.make_node("Add", ["x", "w"], ["ie_out"])], "inner_else", [("ie_out", F, [2, 3])]
        )
        other = subgraph(
            [
                helper.make_node(
                    "If", ["c2"], ["e_out"], then_branch=inner_then, else_branch=inner_else
                )
            ],
            "else",
            [("e_out", F, [2, 3])],
        )
    else:
        other = subgraph(
            [helper.make_node("Sub", ["x", "one"], ["e_out"])], "else", [("e_out", F, [2, 3])]
        )
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inputs = {"c": [], "x": [2, 3]}
    dtypes = {"c": B}
    if nested:
        inputs["c2"] = []
        dtypes["c2"] = B
    return make_model(
        nodes,
        inputs,
        ["y"],
        input_dtypes=dtypes,
        output_shapes={"y": [2, 3]},
        initializers={"w": np.full((2, 3), 1.5, np.float32), "one": np.ones((), np.float32)},
    )


@pytest.mark.parametrize("cond", [True, False])
def test_if_takes_either_branch_like_onnxruntime(cond: bool) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    assert_matches_ort(_if_model(), {"c": np.array(cond), "x": x})


@pytest.mark.parametrize("c, c2", [(True, True), (False, True), (False, False)])
def test_nested_if_like_onnxruntime(c: bool, c2: bool) -> None:
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    assert_matches_ort(_if_model(nested=True), {"c": np.array(c), "x": x, "c2": np.array(c2)})


def test_if_subgraphs_are_stored_with_implicit_inputs() -> None:
    model = convert(_if_model(nested=True))
    node = model.graphs[0].nodes[0]
    assert node.op == OpCode.IF
    assert len(model.graphs) == 5  # main, then, else, and the nested If's two branches
    # the outer x is an explicit input of the If node and of both branch graphs
    x = model.signature().inputs["x"]
    assert x in node.inputs[1:]
    for gi in (node.attrs["then_graph"], node.attrs["else_graph"]):
        assert len(model.graphs[gi].inputs) == len(node.inputs) - 1


def test_if_with_static_condition_is_inlined() -> None:
    then = subgraph([helper.make_node("Relu", ["x"], ["t"])], "then", [("t", F, [4])])
    other = subgraph([helper.make_node("Neg", ["x"], ["e"])], "else", [("e", F, [4])])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", B, [], [0])),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    model = make_model(nodes, {"x": [4]}, ["y"], output_shapes={"y": [4]})
    x = np.array([-1, 2, -3, 4], np.float32)
    assert_matches_ort(model, {"x": x})
    assert [n.op for n in convert(model).graphs[0].nodes] == [OpCode.NEG]


def test_if_branches_of_different_shapes_are_refused_clearly() -> None:
    then = subgraph([helper.make_node("Relu", ["x"], ["t"])], "then", [("t", F, None)])
    other = subgraph(
        [helper.make_node("ReduceSum", ["x"], ["e"], keepdims=0)], "else", [("e", F, None)]
    )
    model = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        {"c": [], "x": [4]},
        ["y"],
        input_dtypes={"c": B},
        output_shapes={"y": [4]},
    )
    with pytest.raises(
        ConversionError,
        match=r"float32\[4\] in the then branch but "
        r"float32\[\] in the else branch",
    ):
        convert(model)


def _loop_model(*, trip: int | None, with_cond: bool, scan: bool):
    """Carried s = s + x * i (the outer x); cond_out = s < limit; scan output = s."""
    body_nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["s_in", "xi"], ["s_out"]),
        helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
        helper.make_node("Less", ["total", "limit"], ["c_out"]),
    ]
    outputs = [("c_out", B, []), ("s_out", F, [3])]
    if scan:
        body_nodes.append(helper.make_node("Identity", ["s_out"], ["scan_out"]))
        outputs.append(("scan_out", F, [3]))
    body = subgraph(
        body_nodes,
        "body",
        outputs,
        inputs=[
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", B, []),
            helper.make_tensor_value_info("s_in", F, [3]),
        ],
    )
    inits = {"limit": np.array(40.0, np.float32)}
    if trip is not None:
        inits["M"] = np.array(trip, np.int64)
    loop_outputs = ["s_final"] + (["scans"] if scan else [])
    node = helper.make_node(
        "Loop",
        ["M" if trip is not None else "", "c" if with_cond else "", "s0"],
        loop_outputs,
        body=body,
    )
    inputs = {"x": [3], "s0": [3]}
    dtypes = {}
    if with_cond:
        inputs["c"] = []
        dtypes["c"] = B
    shapes = {"s_final": [3]}
    if scan:
        shapes["scans"] = [trip, 3]
    return make_model(
        [node], inputs, loop_outputs, initializers=inits, input_dtypes=dtypes, output_shapes=shapes
    )


@pytest.mark.parametrize("with_cond", [False, True])
def test_loop_with_trip_count_and_cond_like_onnxruntime(with_cond: bool) -> None:
    feeds = {"x": np.array([1.0, -0.5, 2.0], np.float32), "s0": np.zeros(3, np.float32)}
    if with_cond:
        feeds["c"] = np.array(True)
    # the condition stops the loop before the trip count (s grows past the limit)
    want = assert_matches_ort(_loop_model(trip=50, with_cond=with_cond, scan=False), feeds)
    assert want[0].sum() >= 40.0


def test_loop_stops_on_false_initial_cond() -> None:
    feeds = {"x": np.ones(3, np.float32), "s0": np.full(3, 7.0, np.float32), "c": np.array(False)}
    want = assert_matches_ort(_loop_model(trip=5, with_cond=True, scan=False), feeds)
    np.testing.assert_array_equal(want[0], feeds["s0"])


def test_loop_with_scan_outputs_like_onnxruntime() -> None:
    feeds = {"x": np.array([0.5, 0.25, -1.0], np.float32), "s0": np.ones(3, np.float32)}
    want = assert_matches_ort(_loop_model(trip=4, with_cond=False, scan=True), feeds)
    assert want[1].shape == (4, 3)


def test_loop_scan_output_of_the_previous_carried_value() -> None:
    """A scan output that is the carried value as it entered the iteration (Range's ONNX
    function body) stacks that value, not the one the iteration leaves."""
    body = subgraph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Add", ["s_in", "x"], ["s_out"]),
            helper.make_node("Identity", ["s_in"], ["seen"]),
        ],
        "body",
        [("c_out", B, []), ("s_out", F, [3]), ("seen", F, [3])],
        inputs=[
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", B, []),
            helper.make_tensor_value_info("s_in", F, [3]),
        ],
    )
    model = make_model(
        [helper.make_node("Loop", ["M", "", "s0"], ["s", "stack"], body=body)],
        {"x": [3], "s0": [3]},
        ["s", "stack"],
        initializers={"M": np.array(4, np.int64)},
        output_shapes={"s": [3], "stack": [4, 3]},
    )
    feeds = {"x": np.array([1.0, -2.0, 0.5], np.float32), "s0": np.zeros(3, np.float32)}
    want = assert_matches_ort(model, feeds)
    np.testing.assert_array_equal(want[1][0], feeds["s0"])


def test_loop_scan_outputs_need_a_static_trip_count() -> None:
    model = _loop_model(trip=None, with_cond=True, scan=True)
    with pytest.raises(ConversionError, match="trip count"):
        convert(model)


def test_loop_carried_shape_change_is_refused() -> None:
    body = subgraph(
        [
            helper.make_node("Concat", ["s_in", "s_in"], ["s_out"], axis=0),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [("c_out", B, []), ("s_out", F, None)],
        inputs=[
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", B, []),
            helper.make_tensor_value_info("s_in", F, None),
        ],
    )
    model = make_model(
        [helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body)],
        {"s0": [2]},
        ["s"],
        initializers={"M": np.array(2, np.int64)},
        output_shapes={"s": [8]},
    )
    with pytest.raises(ConversionError, match="loop-carried value 0"):
        convert(model)


def _hostile(mutate) -> str:
    """A converted If model, changed by `mutate`, must fail validation (as parse does)."""
    from sporenet.lite.validate import validate

    model = convert(_if_model(nested=True))
    mutate(model)
    with pytest.raises(ModelFormatError) as info:
        validate(model)
    return str(info.value)


def test_subgraph_index_out_of_range_is_a_format_error() -> None:
    message = _hostile(lambda m: m.graphs[0].nodes[0].attrs.update(then_graph=99))
    assert "then_graph 99 out of range" in message


def test_subgraph_naming_the_entry_graph_is_a_format_error() -> None:
    message = _hostile(lambda m: m.graphs[0].nodes[0].attrs.update(else_graph=0))
    assert "entry graph" in message


def test_subgraph_index_of_wrong_type_is_a_format_error() -> None:
    message = _hostile(lambda m: m.graphs[0].nodes[0].attrs.update(then_graph="1"))
    assert "must be a graph index" in message


def test_subgraph_cycle_is_a_format_error() -> None:
    def loop_back(model) -> None:
        outer = model.graphs[0].nodes[0]
        else_graph = model.graphs[outer.attrs["else_graph"]]
        inner = next(n for n in else_graph.nodes if n.op == OpCode.IF)
        # The else branch calls itself, with inputs that fit its signature (x, c2).
        gi = outer.attrs["else_graph"]
        inner.attrs.update(then_graph=gi, else_graph=gi)
        inner.inputs = [inner.inputs[0], *else_graph.inputs]

    assert "subgraph references form a cycle" in _hostile(loop_back)


def test_branch_signature_mismatch_is_a_format_error() -> None:
    def retype(model) -> None:
        then = model.graphs[model.graphs[0].nodes[0].attrs["then_graph"]]
        model.tensors[then.outputs[0]].dtype = np.dtype(np.int32)

    assert "gives outputs" in _hostile(retype)


def test_a_taken_branch_that_cannot_run_raises_clearly() -> None:
    """The then branch reshapes x to [2, 2], impossible for x of 3 elements (onnxruntime
    fails there too); the model converts and runs the else branch."""
    from sporenet.lite import Interpreter
    from sporenet.lite.errors import ShapeError

    shape = np.array([2, 2], np.int64)
    then = subgraph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["t"]),
            helper.make_node("ReduceSum", ["t"], ["t2"], keepdims=0),
        ],
        "then",
        [("t2", F, [])],
    )
    other = subgraph(
        [helper.make_node("ReduceMax", ["x"], ["e"], keepdims=0)], "else", [("e", F, [])]
    )
    model = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        {"c": [], "x": [3]},
        ["y"],
        input_dtypes={"c": B},
        initializers={"shape": shape},
        output_shapes={"y": []},
    )
    x = np.array([1.0, 5.0, 2.0], np.float32)
    interpreter = Interpreter(model_content=convert_onnx(model))
    assert interpreter.run({"c": np.array(False), "x": x})["y"] == 5.0
    with pytest.raises(ShapeError, match="the then branch cannot run"):
        interpreter.run({"c": np.array(True), "x": x})


def test_scan_with_state_and_scan_output_like_onnxruntime() -> None:
    """Scan-9: a running sum over rows of x (state) and each partial sum scaled by the
    outer w (scan output)."""
    body = subgraph(
        [
            helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
            helper.make_node("Mul", ["acc_out", "w"], ["scaled"]),
        ],
        "body",
        [("acc_out", F, [3]), ("scaled", F, [3])],
        inputs=[
            helper.make_tensor_value_info("acc_in", F, [3]),
            helper.make_tensor_value_info("row", F, [3]),
        ],
    )
    node = helper.make_node("Scan", ["acc0", "x"], ["acc", "ys"], body=body, num_scan_inputs=1)
    model = make_model(
        [node],
        {"acc0": [3], "x": [5, 3], "w": [3]},
        ["acc", "ys"],
        output_shapes={"acc": [3], "ys": [5, 3]},
    )
    rng = np.random.default_rng(2)
    feeds = {
        "acc0": rng.standard_normal(3).astype(np.float32),
        "x": rng.standard_normal((5, 3)).astype(np.float32),
        "w": rng.standard_normal(3).astype(np.float32),
    }
    assert_matches_ort(model, feeds)
    assert [n.op for n in convert(model).graphs[0].nodes] == [OpCode.LOOP]


def test_gather_of_one_constant_index_follows_each_run() -> None:
    """Silero VAD's If condition reads sr through Gather(Reshape(sr), 0): one constant index
    into 1-D run-time data must read the data of each run, not of planning time."""
    from sporenet.lite import Interpreter

    nodes = [helper.make_node("Gather", ["x", "i"], ["y"], axis=0)]
    model = make_model(
        nodes,
        {"x": [3]},
        ["y"],
        input_dtypes={"x": TensorProto.INT64},
        initializers={"i": np.array(1, np.int64)},
    )
    interpreter = Interpreter(model_content=convert_onnx(model))
    for x in (np.array([7, 16000, 9]), np.array([1, 2, 3])):
        assert interpreter.run({"x": x})["y"] == x[1]


def test_branch_initializers_are_imported() -> None:
    """A branch may hold its own initializers (ONNX names are unique across subgraphs)."""
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "k_then"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", F, [2])],
        initializer=[helper.make_tensor("k_then", F, [2], [10.0, 20.0])],
    )
    other = subgraph([helper.make_node("Sub", ["x", "k"], ["e"])], "else", [("e", F, [2])])
    model = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        {"c": [], "x": [2]},
        ["y"],
        input_dtypes={"c": B},
        initializers={"k": np.array([1.0, 2.0], np.float32)},
        output_shapes={"y": [2]},
    )
    x = np.array([0.5, -0.5], np.float32)
    for cond in (True, False):
        assert_matches_ort(model, {"c": np.array(cond), "x": x})


def test_loop_that_never_ends_is_refused() -> None:
    """No trip count and a body condition that is constant true: refused, not a hang."""
    from sporenet.lite.errors import ShapeError
    from sporenet.lite.planner import plan

    body = subgraph(
        [
            helper.make_node("Constant", [], ["c_out"], value=helper.make_tensor("t", B, [], [1])),
            helper.make_node("Identity", ["s_in"], ["s_out"]),
        ],
        "body",
        [("c_out", B, []), ("s_out", F, [2])],
        inputs=[
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", B, []),
            helper.make_tensor_value_info("s_in", F, [2]),
        ],
    )
    model = make_model(
        [helper.make_node("Loop", ["", "", "s0"], ["s"], body=body)],
        {"s0": [2]},
        ["s"],
        output_shapes={"s": [2]},
    )
    with pytest.raises((ConversionError, ShapeError), match="would never end"):
        plan(convert(model, optimize=False))


def _running_sum_scan(length: int | str):
    """Scan-9 of a running sum over the rows of x [length, 3], each partial sum stacked."""
    body = subgraph(
        [
            helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["partial"]),
        ],
        "body",
        [("acc_out", F, [3]), ("partial", F, [3])],
        inputs=[
            helper.make_tensor_value_info("acc_in", F, [3]),
            helper.make_tensor_value_info("row", F, [3]),
        ],
    )
    node = helper.make_node("Scan", ["acc0", "x"], ["acc", "ys"], body=body, num_scan_inputs=1)
    return make_model(
        [node], {"acc0": [3], "x": [length, 3]}, ["acc", "ys"], output_shapes={"acc": [3]}
    )


def test_scan_over_a_dynamic_length_follows_each_run() -> None:
    """The scanned length is a dynamic input dimension: the trip count is its Shape, planned
    with the input, and the scan output's first dimension follows it."""
    model = _running_sum_scan("T")
    rng = np.random.default_rng(4)
    for length in (1, 5, 9):
        feeds = {
            "acc0": rng.standard_normal(3).astype(np.float32),
            "x": rng.standard_normal((length, 3)).astype(np.float32),
        }
        want = assert_matches_ort(model, feeds)
        assert want[1].shape == (length, 3)
    ir = convert(model)
    ys = ir.signatures["infer"].outputs["ys"]
    assert ir.tensors[ys].shape == (-1, 3)


def test_loop_trip_count_from_an_input_shape_gives_dynamic_scan_outputs() -> None:
    """M = Shape(x)[0] on a dynamic dimension: its scan outputs are [M, 3], M planned."""
    body = subgraph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
            helper.make_node("Add", ["s_in", "row"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["seen"]),
        ],
        "body",
        [("c_out", B, []), ("s_out", F, [3]), ("seen", F, [3])],
        inputs=[
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("c_in", B, []),
            helper.make_tensor_value_info("s_in", F, [3]),
        ],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["M"], axis=0),
        helper.make_node("Loop", ["M", "", "s0"], ["s", "stack"], body=body),
    ]
    model = make_model(
        nodes,
        {"x": ["T", 3], "s0": [3]},
        ["s", "stack"],
        initializers={"zero": np.array(0, np.int64)},
        output_shapes={"s": [3]},
    )
    rng = np.random.default_rng(5)
    for length in (2, 7):
        feeds = {
            "x": rng.standard_normal((length, 3)).astype(np.float32),
            "s0": np.zeros(3, np.float32),
        }
        want = assert_matches_ort(model, feeds)
        assert want[1].shape == (length, 3)
