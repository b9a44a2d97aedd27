"""Gradients of CALL, IF and LOOP (subgraph ops) against finite differences and PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode, UnsupportedOpError
from sporenet.lite.autodiff import append_gradients
from sporenet.lite.builder import fill_inferred_shapes
from sporenet.lite.graph import Graph, Model
from tests.unit.autodiff.gradcheck import check_op, rand

F64 = np.float64


def _subgraph(b: ModelBuilder, name: str, specs: list, body: Callable[..., list[int]]) -> int:
    """Record body(*inputs) as a subgraph of the builder; specs are (shape, dtype)."""
    inputs = [b.tensor(f"{name}/in", shape, dtype) for shape, dtype in specs]
    saved, b.nodes = b.nodes, []
    try:
        outputs = body(*inputs)
        nodes = b.nodes
    finally:
        b.nodes = saved
    graph = Graph(name=name, inputs=inputs, outputs=outputs, nodes=nodes)
    index = b.subgraph(graph)
    # The subgraph's tensors get their dtypes and shapes (the validator compares them).
    fill_inferred_shapes(Model(tensors=b.tensors, graphs=[graph, *b.subgraphs]), 0)
    return index


def _f64(b: ModelBuilder, y: int) -> int:
    """A subgraph node's output declared float64 (the validator compares it with the
    subgraph's outputs before shapes are inferred)."""
    b.tensors[y].dtype = np.dtype(F64)
    return y


def test_call_without_grad_graph_differentiates_its_graph():
    def build(b, x, w):
        def body(xi, wi):
            return [b.op(OpCode.TANH, [b.op(OpCode.MATMUL, [xi, wi])])]

        g = _subgraph(b, "f", [((3, 4), F64), ((4, 2), F64)], body)
        return _f64(b, b.op(OpCode.CALL, [x, w], graph=g))

    check_op(
        build,
        {"x": rand(3, 4, seed=1)},
        {"w": rand(4, 2, seed=2)},
        torch_fn=lambda x, w: (x @ w).tanh(),
    )


def test_call_uses_its_grad_graph_instead_of_the_automatic_gradient():
    # Forward relu(x); the custom backward is dout * 3 (not relu's mask), so the result
    # shows which rule ran.
    b = ModelBuilder()
    x = b.input("x", (4,), F64)
    g = _subgraph(b, "f", [((4,), F64)], lambda xi: [b.op(OpCode.RELU, [xi])])

    def bprop(xi, yi, dyi):
        return [b.op(OpCode.MUL, [dyi, b.constant("three", np.array(3.0), F64)])]

    gg = _subgraph(b, "bprop", [((4,), F64)] * 3, bprop)
    y = _f64(b, b.op(OpCode.CALL, [x], graph=g, grad_graph=gg))
    loss = b.op(OpCode.REDUCE_SUM, [y], keepdims=0)
    b.output(loss, "loss")
    model = b.build()
    grads = append_gradients(model, 0, loss, [x])
    model.graphs[0].outputs.append(grads[x])
    model.signatures["infer"].outputs["dx"] = grads[x]
    from sporenet.lite.interpreter import Interpreter

    out = Interpreter(model=model).run({"x": np.array([-1.0, 2.0, 0.5, -3.0])})
    np.testing.assert_array_equal(out["dx"], np.full(4, 3.0))


def _branches(b: ModelBuilder) -> tuple[int, int]:
    spec = [((2, 3), F64), ((3,), F64)]
    then = _subgraph(
        b, "then", spec, lambda xi, wi: [b.op(OpCode.MUL, [b.op(OpCode.TANH, [xi]), wi])]
    )
    other = _subgraph(b, "else", spec, lambda xi, wi: [b.op(OpCode.SUB, [xi, wi])])
    return then, other


@pytest.mark.parametrize("flag", [True, False])
def test_if_gradient_follows_the_branch_taken(flag):
    def build(b, x, w, c):
        then, other = _branches(b)
        return _f64(b, b.op(OpCode.IF, [c, x, w], then_graph=then, else_graph=other))

    torch_fn = (lambda x, w, c: x.tanh() * w) if flag else (lambda x, w, c: x - w)
    check_op(
        build,
        {"x": rand(2, 3, seed=3), "c": np.array(flag)},
        {"w": rand(3, seed=4)},
        torch_fn=torch_fn,
        wrt=["x", "w"],
    )


def _loop_model(trips: int) -> Callable[..., int]:
    def build(b, h, w):
        def body(i, keep, hi, wi):
            nxt = b.op(OpCode.TANH, [b.op(OpCode.MATMUL, [hi, wi])])
            return [b.op(OpCode.IDENTITY, [keep]), nxt]

        spec = [((), np.int64), ((), np.bool_), ((2, 3), F64), ((3, 3), F64)]
        g = _subgraph(b, "body", spec, body)
        trip = b.constant("trips", np.array(trips, np.int64))
        return _f64(b, b.op(OpCode.LOOP, [trip, -1, h, w], body=g, num_carried=1))

    return build


def _torch_loop(trips: int) -> Callable:
    def fn(h, w):
        for _ in range(trips):
            h = (h @ w).tanh()
        return h

    return fn


def test_loop_gradient_runs_the_body_backwards():
    check_op(
        _loop_model(6),
        {"h": rand(2, 3, seed=5)},
        {"w": rand(3, 3, seed=6, scale=0.5)},
        torch_fn=_torch_loop(6),
    )


def test_loop_gradient_has_as_many_nodes_for_any_trip_count():
    counts = {
        trips: sum(
            len(g.nodes)
            for g in check_op(
                _loop_model(trips), {"h": rand(2, 3)}, {"w": rand(3, 3, scale=0.5)}
            ).model.graphs
        )
        for trips in (1, 7)
    }
    assert counts[1] == counts[7]


def test_loop_without_a_constant_trip_count_has_no_gradient():
    b = ModelBuilder()
    h = b.input("h", (2, 3), F64)
    trips = b.input("trips", (), np.int64)

    def body(i, keep, hi):
        return [b.op(OpCode.IDENTITY, [keep]), b.op(OpCode.TANH, [hi])]

    g = _subgraph(b, "body", [((), np.int64), ((), np.bool_), ((2, 3), F64)], body)
    y = _f64(b, b.op(OpCode.LOOP, [trips, -1, h], body=g, num_carried=1))
    loss = b.op(OpCode.REDUCE_SUM, [y], keepdims=0)
    b.output(loss, "loss")
    model = b.build()
    with pytest.raises(UnsupportedOpError, match="trip count"):
        append_gradients(model, 0, loss, [h])


def test_loop_scan_outputs_have_gradients():
    # The per-iteration values h_t * w2 stacked by the LOOP are the op's output.
    def build(b, h, w):
        def body(i, keep, hi, wi):
            nxt = b.op(OpCode.TANH, [b.op(OpCode.MATMUL, [hi, wi])])
            return [b.op(OpCode.IDENTITY, [keep]), nxt, b.op(OpCode.MUL, [nxt, nxt])]

        spec = [((), np.int64), ((), np.bool_), ((2, 3), F64), ((3, 3), F64)]
        g = _subgraph(b, "body", spec, body)
        trip = b.constant("trips", np.array(4, np.int64))
        final, stacked = b.op_multi(OpCode.LOOP, [trip, -1, h, w], 2, body=g, num_carried=1)
        _f64(b, final)
        return _f64(b, stacked)

    def torch_fn(h, w):
        import torch

        rows = []
        for _ in range(4):
            h = (h @ w).tanh()
            rows.append(h * h)
        return torch.stack(rows)

    check_op(
        build, {"h": rand(2, 3, seed=8)}, {"w": rand(3, 3, seed=9, scale=0.5)}, torch_fn=torch_fn
    )
