"""custom_gradient and Module.bprop: the user's backward replaces the automatic one in
eager mode, graph mode, the saved .spore training graph and lite's Trainer."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud import ops
from sporenet.cloud.trace import LOGITS_NAME, trace
from sporenet.lite import Interpreter, load, save
from sporenet.lite.ops import OpCode
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model


def _scaled_bprop(x, out, dout):
    return dout * 3.0  # deliberately not relu's gradient, so the result shows which ran


@cloud.custom_gradient(_scaled_bprop)
def relu_scaled_backward(x):
    return ops.relu(x)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_custom_backward_replaces_the_automatic_one(mode):
    x = np.array([-1.0, 2.0, 0.5])
    with cloud.using_mode(mode):
        np.testing.assert_array_equal(cloud.function(relu_scaled_backward)(x), [0.0, 2.0, 0.5])
        # d/dx sum(f(x) * x) = 3 x + relu(x) with the custom backward
        g = cloud.grad(lambda x: ops.sum(relu_scaled_backward(x) * x))(x)
        np.testing.assert_allclose(g, 3 * x + np.maximum(x, 0))
        g = cloud.grad(lambda x: ops.sum(relu_scaled_backward(x * x)))(x)  # chain rule
        np.testing.assert_allclose(g, 3 * 2 * x)


def _logistic_bprop(x, out, dout):
    return dout * out * (1.0 - out)  # reuses the forward output, as MindSpore's example


@cloud.custom_gradient(_logistic_bprop)
def logistic(x):
    return 1.0 / (1.0 + ops.exp(-x))


def test_a_custom_backward_is_differentiated_again():
    # grad(grad(logistic)) differentiates the bprop's subgraph (MUL, SUB: ops with rules).
    x = np.array(0.4)
    s = 1 / (1 + np.exp(-0.4))
    with cloud.using_mode("graph"):
        np.testing.assert_allclose(cloud.grad(cloud.grad(logistic))(x), s * (1 - s) * (1 - 2 * s))


class Logistic(cloud.Module):
    """A layer with MindSpore's Cell.bprop."""

    def forward(self, x):
        return 1.0 / (1.0 + ops.exp(-x))

    def bprop(self, x, out, dout):
        return dout * out * (1.0 - out)


def _net():
    cloud.manual_seed(0)
    return cloud.Sequential(L.Dense(4, 8), Logistic(), L.Dense(8, 3))


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype(np.float32), rng.integers(0, 3, 64)


def test_fit_uses_bprop_in_both_modes_and_matches_the_automatic_gradient():
    x, y = _data()
    nets = [_net() for _ in range(2)]
    plain = cloud.Sequential(L.Dense(4, 8), L.Sigmoid(), L.Dense(8, 3))
    for (_, p), (_, q) in zip(plain.named_parameters(), nets[0].named_parameters(), strict=True):
        p.value[...] = q.value
    runs = [
        cloud.fit(net, x, y, epochs=2, mode=mode, verbose=0, optimizer=cloud.SGD(lr=0.1))
        for net, mode in ((nets[0], "graph"), (nets[1], "eager"), (plain, "graph"))
    ]
    np.testing.assert_allclose(runs[0]["loss"], runs[1]["loss"], rtol=1e-6)
    np.testing.assert_allclose(runs[0]["loss"], runs[2]["loss"], rtol=1e-5)


def test_the_bprop_is_saved_in_the_spore_training_graph(tmp_path):
    x, y = _data()
    net = _net()
    twin = copy.deepcopy(net)
    ir = trace(net, (4,), training=False)
    train = make_training_model(
        ir,
        output=LOGITS_NAME,
        loss="softmax_cross_entropy",
        optimizer=OptimizerConfig(kind="sgd"),
        trainable={name for name, _ in net.named_parameters()},
    )
    path = tmp_path / "train.spore"
    save(train, path)
    loaded = load(path)
    calls = [n for g in loaded.graphs for n in g.nodes if n.op == OpCode.CALL]
    assert any(n.attrs.get("grad_graph", -1) != -1 for n in calls)  # the forward, with bprop
    assert len(calls) >= 2  # and the CALL of the bprop in the backward
    trainer = Trainer(loaded)
    losses = [trainer.step({"input": x[:32], "labels": y[:32]}, 0.1) for _ in range(3)]
    history = cloud.fit(
        twin,
        x[:32],
        y[:32],
        epochs=3,
        batch_size=32,
        shuffle=False,
        mode="graph",
        verbose=0,
        optimizer=cloud.SGD(lr=0.1),
    )
    np.testing.assert_allclose(losses, history["loss"], rtol=1e-6)
    # The trained inference model keeps the CALL's subgraphs (and its bprop, for later
    # fine-tuning) and gives what the module trained by fit gives.
    exported = trainer.export()
    assert any(n.op == OpCode.CALL for n in exported.graphs[0].nodes)
    logits = Interpreter(model=exported).run({"input": x})["logits"]
    np.testing.assert_allclose(logits, cloud.predict(twin, x), rtol=1e-5, atol=1e-6)


def test_a_bprop_that_reads_outside_values_is_refused():
    w = None

    def bprop(x, out, dout):
        return dout * w

    @cloud.custom_gradient(bprop)
    def f(x):
        return x * 2.0

    def loss(x, v):
        nonlocal w
        w = v
        return ops.sum(f(x))

    with cloud.using_mode("graph"), pytest.raises(cloud.TraceError, match="bprop reads"):
        cloud.grad(loss)(np.ones(2), np.ones(2))
