"""IF operands that are constants are read as constants inside the branches: the IF and
its branches lose those inputs, the passes after fold inside the branches, and outputs
match a float64 reference; variables, written inputs and shared branches stay operands."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet.converter import convert_tflite_model
from sporenet.converter.passes.subgraph_constants import inline_branch_constants
from sporenet.lite import Interpreter, ModelBuilder, OpCode
from sporenet.lite.graph import Graph, Model, Node
from tests.unit.converter.tflite_builder import TfliteBuilder, rand

W = rand(3, 4, seed=7)
B = rand(3, seed=8)


def _dense_branch(b: TfliteBuilder, *, bias: bool) -> int:
    """A branch (x, w, b) -> x @ w.T (+ b), weights and bias taken as operands, as the
    TFLite converter writes an IF over a Keras head."""
    g, index = b.subgraph()
    x, w, bb = g.input("x", [1, 4]), g.input("w", [3, 4]), g.input("b", [3])
    y = g.output(g.tensor("y", [1, 3]))
    if bias:
        f = g.tensor("f", [1, 3])
        g.op("FULLY_CONNECTED", [x, w], [f], "FullyConnectedOptions", FusedActivationFunction=0)
        g.op("ADD", [f, bb], [y], "AddOptions")
    else:
        g.op("FULLY_CONNECTED", [x, w], [y], "FullyConnectedOptions", FusedActivationFunction=0)
    return index


def _if_over_weights() -> bytes:
    b = TfliteBuilder()
    then_index = _dense_branch(b, bias=True)
    else_index = _dense_branch(b, bias=False)
    c = b.input("c", [], np.bool_)
    x = b.input("x", [1, 4])
    y = b.output(b.tensor("y", [1, 3]))
    operands = [c, x, b.const("w", W), b.const("b", B)]
    b.op(
        "IF", operands, [y], "IfOptions", ThenSubgraphIndex=then_index, ElseSubgraphIndex=else_index
    )
    return b.build()


@pytest.mark.parametrize("flag", [True, False])
def test_weights_of_a_tflite_if_become_constants_of_its_branches(flag):
    model, _ = convert_tflite_model(_if_over_weights())
    (node,) = model.graphs[0].nodes
    assert node.op == OpCode.IF
    assert len(node.inputs) == 2  # the condition and x: w and b are read as constants
    for name in ("then_graph", "else_graph"):
        branch = model.graphs[node.attrs[name]]  # type: ignore[index]
        assert len(branch.inputs) == 1
        readers = [i for n in branch.nodes for i in n.inputs]
        assert any(model.tensors[i].data is not None for i in readers)
    x = rand(1, 4, seed=9)
    got = Interpreter(model=model).run({"c": np.array(flag), "x": x})["y"]
    want = x.astype(np.float64) @ W.T.astype(np.float64) + (B if flag else 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _node(op: OpCode, inputs: list[int], outputs: list[int]) -> Node:
    return Node(op, inputs, outputs, name=f"{op.name.lower()}_{inputs[0]}")


def _ir_if(*, write_in_branch: bool = False, variable: bool = False, shared: bool = False) -> Model:
    """IF(c, x, k) over IR branches y = x + k (then) and y = x * k (else), k constant; the
    then branch may write k in place (ASSIGN), k may be a variable the main graph
    writes, or one graph may serve as both branches."""
    b = ModelBuilder()
    c, x = b.input("c", (), np.bool_), b.input("x", (2, 3))
    k = b.constant("k", np.arange(6, dtype=np.float32).reshape(2, 3))
    branches = []
    for op in (OpCode.ADD, OpCode.MUL):
        gx, gk = b.tensor(f"{op.name}.x", (2, 3)), b.tensor(f"{op.name}.k", (2, 3))
        gy = b.tensor(f"{op.name}.y", (2, 3))
        nodes = [_node(op, [gx, gk], [gy])]
        if write_in_branch and op == OpCode.ADD:
            nodes.append(_node(OpCode.ASSIGN, [gk, gx], []))
        branches.append(b.subgraph(Graph(f"{op.name}.g", [gx, gk], [gy], nodes)))
    if shared:
        branches[1] = branches[0]
    y = b.op(OpCode.IF, [c, x, k], then_graph=branches[0], else_graph=branches[1])
    if variable:
        b.nodes.append(_node(OpCode.ASSIGN, [k, x], []))
    b.output(y, name="y")
    return b.build()


def _run(model: Model, flag: bool, x: np.ndarray) -> np.ndarray:
    return Interpreter(model=model).run({"c": np.array(flag), "x": x})["y"]


def test_an_ir_constant_operand_is_inlined_and_both_branches_agree():
    model = _ir_if()
    rewritten = copy.deepcopy(model)
    assert inline_branch_constants(rewritten) == 1
    assert rewritten.graphs[0].nodes[0].inputs == model.graphs[0].nodes[0].inputs[:2]
    assert all(len(g.inputs) == 1 for g in rewritten.graphs[1:])
    x = rand(2, 3, seed=4)
    k = np.arange(6, dtype=np.float64).reshape(2, 3)
    np.testing.assert_array_equal(_run(rewritten, True, x), (x + k).astype(np.float32))
    np.testing.assert_array_equal(_run(rewritten, False, x), (x * k).astype(np.float32))


@pytest.mark.parametrize(
    "kwargs",
    [{"write_in_branch": True}, {"variable": True}, {"shared": True}],
    ids=["written-in-a-branch", "a-variable", "one-graph-for-both-branches"],
)
def test_operands_that_must_stay_operands(kwargs):
    model = _ir_if(**kwargs)
    rewritten = copy.deepcopy(model)
    assert inline_branch_constants(rewritten) == 0
    assert rewritten.graphs[0].nodes[0].inputs == model.graphs[0].nodes[0].inputs
    assert [g.inputs for g in rewritten.graphs] == [g.inputs for g in model.graphs]
