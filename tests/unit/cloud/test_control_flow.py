"""cond, fori_loop and while_loop: IF/LOOP nodes in graph mode, unrolled in eager mode;
their gradients against the unrolled ones, and loops that keep one body."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud import ops
from sporenet.lite.errors import UnsupportedOpError
from sporenet.lite.ops import OpCode


def _recurrence(trips: int):
    def f(h0, w):
        h = cloud.fori_loop(trips, lambda i, h: ops.tanh(ops.matmul(h, w)), h0)
        return ops.sum(h * h)

    return f


def _nodes(model) -> int:
    return sum(len(g.nodes) for g in model.graphs)


def test_a_100_step_loop_equals_the_unrolled_gradient_with_one_body():
    rng = np.random.default_rng(0)
    h0 = rng.normal(size=(2, 6)).astype(np.float32)
    w = (rng.normal(size=(6, 6)) * 0.4).astype(np.float32)
    f = cloud.value_and_grad(_recurrence(100), argnums=(0, 1))
    with cloud.using_mode("eager"):  # eager runs the loop unrolled, op by op
        unrolled = f(h0, w)
    with cloud.using_mode("graph"):
        looped = f(h0, w)
    np.testing.assert_allclose(looped[0], unrolled[0], rtol=1e-5)
    for got, want in zip(looped[1], unrolled[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    sizes = {t: _nodes(cloud.value_and_grad(_recurrence(t), (0, 1)).graph(h0, w)) for t in (3, 100)}
    assert sizes[3] == sizes[100]
    main = cloud.value_and_grad(_recurrence(100), (0, 1)).graph(h0, w).graphs[0]
    assert sum(n.op == OpCode.LOOP for n in main.nodes) == 3  # forward, states, backward


def test_cond_takes_either_branch_in_both_modes():
    def f(x, w):
        y = cloud.cond(
            ops.greater(ops.sum(x), 0.0),
            lambda x: ops.tanh(x) * w,  # reads w from outside: an implicit input
            lambda x: x - w,
            x,
        )
        return ops.sum(y * y)

    rng = np.random.default_rng(1)
    w = rng.normal(size=(3,))
    for x in (np.abs(rng.normal(size=(2, 3))), -np.abs(rng.normal(size=(2, 3)))):
        results = {}
        for mode in ("eager", "graph"):
            with cloud.using_mode(mode):
                results[mode] = cloud.value_and_grad(f, argnums=(0, 1))(x, w)
        for got, want in zip(results["graph"][1], results["eager"][1], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-12)
    model = cloud.grad(f).graph(x, w)
    assert sum(n.op == OpCode.IF for n in model.graphs[0].nodes) == 2  # forward, backward


def test_while_loop_runs_forward_and_refuses_a_gradient():
    def f(x):
        y = cloud.while_loop(lambda v: ops.less(ops.sum(v), 100.0), lambda v: v * 2.0, x)
        return ops.sum(y)

    x = np.ones(3, np.float32)
    forward = cloud.function(f)
    for mode in ("eager", "graph"):
        with cloud.using_mode(mode):
            assert float(forward(x)) == 192.0  # 1 -> 64 per entry, the first sum >= 100
    with cloud.using_mode("graph"):
        assert sum(n.op == OpCode.LOOP for n in forward.graph(x).graphs[0].nodes) == 1
        with pytest.raises(UnsupportedOpError, match="trip count"):
            cloud.grad(f)(x)


class LoopCell(cloud.Module):
    """h <- tanh(h W + x) repeated `trips` times: a recurrent block as one LOOP."""

    def __init__(self, width: int, trips: int) -> None:
        super().__init__()
        self.trips = trips
        self.cell = L.Dense(width, width)

    def forward(self, x):
        return cloud.fori_loop(self.trips, lambda i, h: ops.tanh(self.cell(h) + x), x)


def test_fit_trains_a_loop_layer_in_graph_mode_like_eager():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(48, 6)).astype(np.float32)
    y = rng.integers(0, 3, 48)
    cloud.manual_seed(0)
    net = cloud.Sequential(L.Dense(6, 8), LoopCell(8, 20), L.Dense(8, 3))
    twin = copy.deepcopy(net)
    graph = cloud.fit(
        net, x, y, epochs=2, batch_size=16, mode="graph", verbose=0, optimizer=cloud.SGD(lr=0.1)
    )
    eager = cloud.fit(
        twin, x, y, epochs=2, batch_size=16, mode="eager", verbose=0, optimizer=cloud.SGD(lr=0.1)
    )
    np.testing.assert_allclose(graph["loss"], eager["loss"], rtol=1e-5)
    for (name, p), (_, q) in zip(net.named_parameters(), twin.named_parameters(), strict=True):
        np.testing.assert_allclose(p.value, q.value, rtol=1e-4, atol=1e-6, err_msg=name)


def _scanned(length: int):
    def f(h0, w):
        def body(i, h):
            nxt = ops.tanh(ops.matmul(h, w))
            return nxt, nxt * nxt  # carried, and one value per step

        final, squares = cloud.scan(body, h0, length)
        return ops.sum(squares) + ops.sum(final)

    return f


def test_scan_collects_per_step_values_and_differentiates_them():
    rng = np.random.default_rng(3)
    h0 = rng.normal(size=(2, 4))
    w = rng.normal(size=(4, 4)) * 0.5
    f = cloud.value_and_grad(_scanned(12), argnums=(0, 1))
    with cloud.using_mode("eager"):
        unrolled = f(h0, w)
    with cloud.using_mode("graph"):
        looped = f(h0, w)
    np.testing.assert_allclose(looped[0], unrolled[0], rtol=1e-12)
    for got, want in zip(looped[1], unrolled[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    torch = pytest.importorskip("torch", reason="PyTorch is an optional test extra")
    th, tw = torch.tensor(h0, requires_grad=True), torch.tensor(w, requires_grad=True)
    h, total = th, 0
    for _ in range(12):
        h = torch.tanh(h @ tw)
        total = total + (h * h).sum()
    (total + h.sum()).backward()
    np.testing.assert_allclose(looped[1][1], tw.grad.numpy(), rtol=1e-10, atol=1e-12)
    sizes = {n: _nodes(cloud.grad(_scanned(n)).graph(h0, w)) for n in (2, 30)}
    assert sizes[2] == sizes[30]
