"""TFLite IF and WHILE subgraphs as IR IF and LOOP, compared with LiteRT."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from sporenet.converter import ConversionError, convert_tflite, convert_tflite_model
from sporenet.lite.ops import OpCode
from tests.unit.converter.tflite_builder import TfliteBuilder, conv, rand
from tests.unit.converter.tflite_ops_check import assert_matches_litert

pytest.importorskip(
    "ai_edge_litert.interpreter", reason="LiteRT (ai-edge-litert, test extra) is the reference"
)


def _branch(b: TfliteBuilder, op: str, value: float, options: str) -> int:
    """A subgraph x -> op(x, value) of shape [2, 3]; returns its index."""
    g, index = b.subgraph()
    x = g.input("x", [2, 3])
    y = g.output(g.tensor("y", [2, 3]))
    g.op(op, [x, g.const("k", np.full((1,), value, np.float32))], [y], options)
    return index


def if_model(*, constant: bool | None = None) -> bytes:
    b = TfliteBuilder()
    then_index = _branch(b, "MUL", 2.0, "MulOptions")
    else_index = _branch(b, "SUB", 1.0, "SubOptions")
    c = b.const("c", [constant], np.bool_) if constant is not None else b.input("c", [1], np.bool_)
    x = b.input("x", [2, 3])
    y = b.output(b.tensor("y", [2, 3]))
    b.op("IF", [c, x], [y], "IfOptions", ThenSubgraphIndex=then_index, ElseSubgraphIndex=else_index)
    return b.build()


@pytest.mark.parametrize("flag", [True, False])
def test_if_with_a_condition_known_when_run(flag):
    data = if_model()
    assert_matches_litert(data, {"c": np.array([flag]), "x": rand(2, 3, seed=1)})
    model, _ = convert_tflite_model(data)
    assert [n.op for n in model.graphs[0].nodes] == [OpCode.IF]


def test_if_with_a_constant_condition_is_inlined():
    data = if_model(constant=False)
    assert_matches_litert(data, {"x": rand(2, 3, seed=2)})
    model, _ = convert_tflite_model(data)
    assert len(model.graphs) == 1 and [n.op for n in model.graphs[0].nodes] == [OpCode.SUB]


def test_if_branch_after_a_convolution_gets_tflite_order():
    # The operand comes out of a CONV_2D (held NCHW): the branch sees TFLite's NHWC.
    b = TfliteBuilder()
    g, then_index = b.subgraph()
    gx = g.input("x", [1, 4, 4, 2])
    gy = g.output(g.tensor("y", [1, 4, 2]))
    g.op("MEAN", [gx, g.const("axes", [1], np.int32)], [gy], "ReducerOptions", KeepDims=False)
    h, else_index = b.subgraph()
    hx = h.input("x", [1, 4, 4, 2])
    hy = h.output(h.tensor("y", [1, 4, 2]))
    h.op("REDUCE_MAX", [hx, h.const("axes", [2], np.int32)], [hy], "ReducerOptions")
    c = b.input("c", [], np.bool_)
    x = b.input("x", [1, 4, 4, 3])
    feature = conv(b, x, 3, 2, (4, 4))
    y = b.output(b.tensor("y", [1, 4, 2]))
    b.op(
        "IF",
        [c, feature],
        [y],
        "IfOptions",
        ThenSubgraphIndex=then_index,
        ElseSubgraphIndex=else_index,
    )
    for flag in (True, False):
        assert_matches_litert(b.build(), {"c": np.array(flag), "x": rand(1, 4, 4, 3, seed=3)})


def while_model() -> bytes:
    # i, acc = 0, x; while i < n: i, acc = i + 1, acc * 0.5 + 1
    b = TfliteBuilder()
    cond, cond_index = b.subgraph()
    ci, cacc, cn = (
        cond.input("i", [], np.int32),
        cond.input("acc", [3]),
        cond.input("n", [], np.int32),
    )
    keep = cond.output(cond.tensor("keep", [], np.bool_))
    cond.op("LESS", [ci, cn], [keep])
    del cacc
    body, body_index = b.subgraph()
    bi, bacc, bn = (
        body.input("i", [], np.int32),
        body.input("acc", [3]),
        body.input("n", [], np.int32),
    )
    ni = body.tensor("i_next", [], np.int32)
    body.op("ADD", [bi, body.const("one", 1, np.int32)], [ni], "AddOptions")
    half = body.tensor("half", [3])
    body.op("MUL", [bacc, body.const("h", [0.5])], [half], "MulOptions")
    nacc = body.tensor("acc_next", [3])
    body.op("ADD", [half, body.const("o", [1.0])], [nacc], "AddOptions")
    body.outputs = [ni, nacc, bn]
    x = b.input("x", [3])
    n = b.input("n", [], np.int32)
    i_out, acc_out, n_out = (
        b.tensor(k, s, d)
        for k, s, d in (
            ("i_out", [], np.int32),
            ("acc_out", [3], np.float32),
            ("n_out", [], np.int32),
        )
    )
    b.output(acc_out)
    b.output(i_out)
    b.op(
        "WHILE",
        [b.const("zero", 0, np.int32), x, n],
        [i_out, acc_out, n_out],
        "WhileOptions",
        CondSubgraphIndex=cond_index,
        BodySubgraphIndex=body_index,
    )
    return b.build()


@pytest.mark.parametrize("n", [0, 1, 5])
def test_while_runs_its_body_until_the_condition_fails(n):
    assert_matches_litert(while_model(), {"x": rand(3, seed=4), "n": np.array(n, np.int32)})


def test_subgraphs_that_call_themselves_are_refused():
    b = TfliteBuilder()
    g, index = b.subgraph()
    gc, gx = g.input("c", [], np.bool_), g.input("x", [2])
    gy = g.output(g.tensor("y", [2]))
    g.op("IF", [gc, gc, gx], [gy], "IfOptions", ThenSubgraphIndex=index, ElseSubgraphIndex=index)
    c, x = b.input("c", [], np.bool_), b.input("x", [2])
    y = b.output(b.tensor("y", [2]))
    b.op("IF", [c, c, x], [y], "IfOptions", ThenSubgraphIndex=index, ElseSubgraphIndex=index)
    with pytest.raises(ConversionError, match="nested more than"):
        convert_tflite(b.build())


def test_corrupted_control_flow_files_raise_only_conversion_errors():
    data = while_model()
    rng = np.random.default_rng(1)
    for _ in range(200):
        corrupted = bytearray(data)
        for at in rng.integers(8, len(data), rng.integers(1, 5)):
            corrupted[at] = rng.integers(0, 256)
        with contextlib.suppress(ConversionError):
            convert_tflite(bytes(corrupted))
