"""A pass that cannot express a rewrite leaves the graph as it was (passes/guard.py): the
converter never writes a graph the runtime rejects."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter.convert import convert_onnx_model
from sporenet.converter.passes import Pass, optimize
from sporenet.converter.passes.guard import problem, restore, run_guarded, take
from sporenet.lite import Interpreter, serialize
from sporenet.lite.builder import ModelBuilder
from sporenet.lite.errors import ShapeError
from sporenet.lite.graph import Model
from sporenet.lite.ops import OpCode
from tests.references import ort_reference_session
from tests.unit.converter.helpers import TensorProto, helper, make_model

F = TensorProto.FLOAT


def _qdq_add_tanh() -> object:
    """x, y -> QDQ int8 -> Add -> Tanh -> QDQ int8: activation fusion folds the Tanh into
    the Add, and QDQ folding would then make it an int8 Add with a fused tanh, which no
    int8 kernel computes."""

    def qdq(name: str, scale: float) -> list:
        s, z = f"{name}_s", f"{name}_z"
        return [
            helper.make_node("Constant", [], [s], value=helper.make_tensor(s, F, [], [scale])),
            helper.make_node(
                "Constant", [], [z], value=helper.make_tensor(z, TensorProto.INT8, [], [0])
            ),
            helper.make_node("QuantizeLinear", [name, s, z], [f"{name}_q"]),
            helper.make_node("DequantizeLinear", [f"{name}_q", s, z], [f"{name}_dq"]),
        ]

    nodes = [
        *qdq("x", 0.02),
        *qdq("y", 0.02),
        helper.make_node("Add", ["x_dq", "y_dq"], ["a"]),
        helper.make_node("Tanh", ["a"], ["t"]),
        *qdq("t", 1 / 127),
        helper.make_node("Identity", ["t_dq"], ["out"]),
    ]
    return make_model(nodes, {"x": [2, 8], "y": [2, 8]}, ["out"], opset=13)


def test_qdq_add_with_tanh_converts_to_a_valid_graph_that_matches() -> None:
    model = _qdq_add_tanh()
    ir, report = convert_onnx_model(model)
    assert problem(ir) is None
    assert report.passes["qdq-activation-fusion"] == 1  # the Tanh fused, kept float
    rng = np.random.default_rng(0)
    feeds = {k: rng.uniform(-2, 2, (2, 8)).astype(np.float32) for k in ("x", "y")}
    got = Interpreter(model_content=serialize(ir)).run(feeds)["out"]
    want = ort_reference_session(model).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, atol=1 / 127 + 1e-6)


def _relu_net() -> Model:
    b = ModelBuilder()
    x = b.input("x", (2, 4))
    w = b.constant("w", np.eye(4, dtype=np.float32))
    y = b.op(OpCode.FULLY_CONNECTED, [x, w])
    b.output(b.op(OpCode.RELU, [y]), "y")
    return b.build()


def _break_fc(model: Model) -> int:
    """A rewrite the runtime rejects: an activation no kernel knows."""
    for node in model.graphs[0].nodes:
        if node.op == OpCode.FULLY_CONNECTED:
            node.attrs["activation"] = "no-such-activation"
    return 1


def test_a_pass_that_breaks_the_graph_is_undone_and_the_others_kept() -> None:
    model = _relu_net()
    breaking = Pass("breaks-fc", _break_fc)
    run = optimize(model, first=(breaking,))
    assert "breaks-fc" in run.undone and run.rewrites["breaks-fc"] == 0
    assert run.rewrites["activation-fusion"] == 1  # the passes after it still ran
    assert problem(model) is None
    assert [n.op for n in model.graphs[0].nodes] == [OpCode.FULLY_CONNECTED]
    assert model.graphs[0].nodes[0].attrs["activation"] == "relu"


def test_a_graph_invalid_before_the_passes_raises_its_own_error() -> None:
    model = _relu_net()
    _break_fc(model)
    with pytest.raises(ShapeError, match="no-such-activation"):
        run_guarded(model, [("noop", lambda m: 0)])


def test_restore_puts_back_renamed_tensors_and_removed_nodes() -> None:
    model = _relu_net()
    snapshot = take(model)
    names = [t.name for t in model.tensors]
    optimize(model)  # fuses the Relu: a node removed, two tensors renamed
    assert len(model.graphs[0].nodes) == 1
    restore(model, snapshot)
    assert [t.name for t in model.tensors] == names
    assert [n.op for n in model.graphs[0].nodes] == [OpCode.FULLY_CONNECTED, OpCode.RELU]
    restore(model, snapshot)  # a snapshot can be restored more than once
    assert problem(model) is None
