"""Resource variables read and assigned inside IF branches and WHILE bodies: threaded
through the IR subgraphs, and persisting between invokes exactly as in LiteRT."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter import convert_tflite
from sporenet.lite import Interpreter
from tests.unit.converter.tflite_builder import RESOURCE, TfliteBuilder, rand

litert = pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)


def _handle(b: TfliteBuilder, name: str) -> int:
    h = b.tensor(f"{name}_handle", [], RESOURCE)
    b.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName=name)
    return h


def _init(b: TfliteBuilder, name: str, value: np.ndarray) -> None:
    """A CALL_ONCE subgraph assigning `value` to variable `name`."""
    init, index = b.subgraph()
    init.op("ASSIGN_VARIABLE", [_handle(init, name), init.const("v", value)], [])
    b.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=index)


def _read(b: TfliteBuilder, name: str, label: str) -> int:
    out = b.tensor(label, [1, 4])
    b.op("READ_VARIABLE", [_handle(b, name)], [out])
    return out


def while_model() -> bytes:
    """i = 0; while i < 3: acc += x * i; i += 1 (acc a variable); y = acc."""
    b = TfliteBuilder()
    cond, cond_index = b.subgraph()
    ci, _ = cond.input("i", [], np.int32), cond.input("x", [1, 4])
    keep = cond.output(cond.tensor("keep", [], np.bool_))
    cond.op("LESS", [ci, cond.const("three", 3, np.int32)], [keep])
    body, body_index = b.subgraph()
    bi, bx = body.input("i", [], np.int32), body.input("x", [1, 4])
    fi = body.tensor("fi", [], np.float32)
    body.op("CAST", [bi], [fi])
    scaled = body.tensor("scaled", [1, 4])
    body.op("MUL", [bx, fi], [scaled], "MulOptions")
    acc = _read(body, "acc", "acc")
    new = body.tensor("new", [1, 4])
    body.op("ADD", [acc, scaled], [new], "AddOptions")
    body.op("ASSIGN_VARIABLE", [_handle(body, "acc"), new], [])
    ni = body.tensor("i_next", [], np.int32)
    body.op("ADD", [bi, body.const("one", 1, np.int32)], [ni], "AddOptions")
    body.outputs = [ni, bx]
    _init(b, "acc", rand(1, 4, seed=2))
    x = b.input("x", [1, 4])
    i_out, x_out = b.tensor("i_out", [], np.int32), b.tensor("x_out", [1, 4])
    b.op(
        "WHILE",
        [b.const("zero", 0, np.int32), x],
        [i_out, x_out],
        "WhileOptions",
        CondSubgraphIndex=cond_index,
        BodySubgraphIndex=body_index,
    )
    b.output(_read(b, "acc", "y"))
    return b.build()


def if_model() -> bytes:
    """then: y = s; s = s + x (s a variable). else: y = 2 x; s untouched."""
    b = TfliteBuilder()
    then, then_index = b.subgraph()
    tx = then.input("x", [1, 4])
    s = _read(then, "s", "s")
    grown = then.tensor("grown", [1, 4])
    then.op("ADD", [s, tx], [grown], "AddOptions")
    then.op("ASSIGN_VARIABLE", [_handle(then, "s"), grown], [])
    then.outputs = [s]
    other, else_index = b.subgraph()
    ex = other.input("x", [1, 4])
    doubled = other.output(other.tensor("doubled", [1, 4]))
    other.op("MUL", [ex, other.const("two", [2.0])], [doubled], "MulOptions")
    _init(b, "s", np.zeros((1, 4), np.float32))
    c, x = b.input("c", [1], np.bool_), b.input("x", [1, 4])
    y = b.output(b.tensor("y", [1, 4]))
    b.op("IF", [c, x], [y], "IfOptions", ThenSubgraphIndex=then_index, ElseSubgraphIndex=else_index)
    b.output(_read(b, "s", "state"))
    return b.build()


def _runs(data: bytes, feeds: list[dict[str, np.ndarray]]) -> None:
    """Each invoke's outputs equal LiteRT's, the state carried from invoke to invoke."""
    ours = Interpreter(model_content=convert_tflite(data))
    ref = litert.Interpreter(model_content=data)
    ref.allocate_tensors()
    names = {d["name"]: d["index"] for d in ref.get_input_details()}
    for feed in feeds:
        for name, value in feed.items():
            ref.set_tensor(names[name], value)
        ref.invoke()
        got = ours.run(feed)
        for d in ref.get_output_details():
            np.testing.assert_allclose(got[d["name"]], ref.get_tensor(d["index"]), rtol=1e-6)


def test_a_variable_accumulated_in_a_while_body_persists_as_in_litert() -> None:
    _runs(while_model(), [{"x": rand(1, 4, seed=k)} for k in range(4)])


def test_a_variable_assigned_in_one_if_branch_persists_as_in_litert() -> None:
    flags = [True, False, True, True, False]
    feeds = [{"c": np.array([f]), "x": rand(1, 4, seed=k)} for k, f in enumerate(flags)]
    _runs(if_model(), feeds)


def passed_handle_model() -> bytes:
    """The main graph's handle looped through WHILE: i = 0; while i < 2: acc += x."""
    b = TfliteBuilder()
    cond, cond_index = b.subgraph()
    ci = cond.input("i", [], np.int32)
    cond.input("x", [1, 4])
    cond.inputs.append(cond.tensor("h", [], RESOURCE))
    keep = cond.output(cond.tensor("keep", [], np.bool_))
    cond.op("LESS", [ci, cond.const("two", 2, np.int32)], [keep])
    body, body_index = b.subgraph()
    bi, bx = body.input("i", [], np.int32), body.input("x", [1, 4])
    bh = body.tensor("h", [], RESOURCE)
    body.inputs.append(bh)
    acc = body.tensor("acc", [1, 4])
    body.op("READ_VARIABLE", [bh], [acc])
    new = body.tensor("new", [1, 4])
    body.op("ADD", [acc, bx], [new], "AddOptions")
    body.op("ASSIGN_VARIABLE", [bh, new], [])
    ni = body.tensor("i_next", [], np.int32)
    body.op("ADD", [bi, body.const("one", 1, np.int32)], [ni], "AddOptions")
    body.outputs = [ni, bx, bh]
    _init(b, "acc", rand(1, 4, seed=5))
    x = b.input("x", [1, 4])
    h = _handle(b, "acc")
    outs = [b.tensor("i_out", [], np.int32), b.tensor("x_out", [1, 4])]
    outs.append(b.tensor("h_out", [], RESOURCE))
    b.op(
        "WHILE",
        [b.const("zero", 0, np.int32), x, h],
        outs,
        "WhileOptions",
        CondSubgraphIndex=cond_index,
        BodySubgraphIndex=body_index,
    )
    y = b.tensor("y", [1, 4])
    b.op("READ_VARIABLE", [outs[2]], [y])
    b.output(y)
    return b.build()


def test_a_handle_looped_through_a_while_is_the_same_variable() -> None:
    _runs(passed_handle_model(), [{"x": rand(1, 4, seed=k)} for k in range(3)])
