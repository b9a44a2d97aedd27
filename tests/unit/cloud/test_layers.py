"""Layer forwards (run eagerly through lite kernels) against NumPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import layers as L
from sporenet.cloud.errors import TraceError
from sporenet.lite import Interpreter

RNG = np.random.default_rng(7)
# float32 kernels against float64 references: differences are rounding only.
TOL = {"rtol": 1e-5, "atol": 1e-5}


def conv_reference(x, w, b, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    per_group = o // groups
    for oc in range(o):
        g = oc // per_group
        for i in range(oh):
            for j in range(ow):
                hs, ws = i * stride[0], j * stride[1]
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    hs : hs + dilation[0] * (kh - 1) + 1 : dilation[0],
                    ws : ws + dilation[1] * (kw - 1) + 1 : dilation[1],
                ]
                out[:, oc, i, j] = (patch * w[oc]).sum(axis=(1, 2, 3))
    return out + (0 if b is None else b[None, :, None, None])


def pool_reference(x, k, s, reduce):
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = reduce(x[:, :, i * s : i * s + k, j * s : j * s + k], axis=(2, 3))
    return out


def test_dense_matches_numpy():
    layer = L.Dense(6, 4)
    x = RNG.normal(size=(5, 6)).astype(np.float32)
    expected = x.astype(np.float64) @ layer.weight.value.T + layer.bias.value
    np.testing.assert_allclose(layer(x), expected, **TOL)
    no_bias = L.Dense(6, 4, bias=False)
    np.testing.assert_allclose(no_bias(x), x.astype(np.float64) @ no_bias.weight.value.T, **TOL)


@pytest.mark.parametrize(
    ("kwargs", "pads"),
    [
        ({"padding": 1}, (1, 1, 1, 1)),
        ({"stride": 2}, (0, 0, 0, 0)),
        ({"padding": "same", "dilation": 2}, (2, 2, 2, 2)),
        ({"groups": 2, "padding": (0, 1)}, (0, 1, 0, 1)),
    ],
)
def test_conv2d_matches_numpy(kwargs, pads):
    layer = L.Conv2d(4, 6, 3, **kwargs)
    x = RNG.normal(size=(2, 4, 7, 7)).astype(np.float32)
    expected = conv_reference(
        x, layer.weight.value, layer.bias.value, layer.stride, pads, layer.dilation, layer.groups
    )
    np.testing.assert_allclose(layer(x), expected, **TOL)


def test_depthwise_conv2d_is_one_filter_per_channel():
    layer = L.DepthwiseConv2d(3, 3, padding=1, depth_multiplier=2)
    assert layer.weight.shape == (6, 1, 3, 3)
    x = RNG.normal(size=(2, 3, 5, 5)).astype(np.float32)
    expected = conv_reference(x, layer.weight.value, layer.bias.value, pads=(1, 1, 1, 1), groups=3)
    np.testing.assert_allclose(layer(x), expected, **TOL)


def test_batchnorm_eval_uses_running_statistics():
    layer = L.BatchNorm2d(3, eps=1e-3)
    layer.running_mean.value[:] = [0.5, -1.0, 2.0]
    layer.running_var.value[:] = [0.25, 4.0, 1.0]
    layer.weight.value[:] = [1.0, 2.0, -0.5]
    layer.bias.value[:] = [0.0, 0.1, 0.2]
    layer.eval()
    x = RNG.normal(size=(4, 3, 2, 2)).astype(np.float32)
    shape = (1, 3, 1, 1)
    expected = (x - layer.running_mean.value.reshape(shape)) / np.sqrt(
        layer.running_var.value.reshape(shape) + 1e-3
    ) * layer.weight.value.reshape(shape) + layer.bias.value.reshape(shape)
    np.testing.assert_allclose(layer(x), expected, **TOL)


def test_pooling_layers_match_numpy():
    x = RNG.normal(size=(2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(L.MaxPool2d(2)(x), pool_reference(x, 2, 2, np.max), **TOL)
    np.testing.assert_allclose(L.AvgPool2d(3, stride=1)(x), pool_reference(x, 3, 1, np.mean), **TOL)
    np.testing.assert_allclose(L.GlobalAvgPool()(x), x.mean(axis=(2, 3)), **TOL)
    assert L.GlobalAvgPool(keepdims=True)(x).shape == (2, 3, 1, 1)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


@pytest.mark.parametrize(
    ("layer", "reference"),
    [
        (L.ReLU(), lambda x: np.maximum(x, 0)),
        (L.ReLU6(), lambda x: np.clip(x, 0, 6)),
        (L.LeakyReLU(0.1), lambda x: np.where(x > 0, x, 0.1 * x)),
        (L.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
        (L.Tanh(), np.tanh),
        (L.HardSwish(), lambda x: x * np.clip(x + 3, 0, 6) / 6),
        (L.SiLU(), lambda x: x / (1 + np.exp(-x))),
        (L.GELU(), _gelu),
    ],
)
def test_activations_match_numpy(layer, reference):
    x = (RNG.normal(size=(3, 50)) * 4).astype(np.float32)
    np.testing.assert_allclose(layer(x), reference(x.astype(np.float64)), **TOL)


def test_flatten_dropout_rescale():
    x = RNG.normal(size=(2, 3, 4, 4)).astype(np.float32)
    assert L.Flatten()(x).shape == (2, 48)
    drop = L.Dropout(0.5).eval()
    np.testing.assert_array_equal(drop(x), x)
    np.testing.assert_allclose(L.Rescale(0.5, 1.0)(x), x * 0.5 + 1.0, **TOL)


def test_module_registers_parameters_and_submodules_by_assignment():
    class Net(cloud.Module):
        def __init__(self):
            super().__init__()
            self.body = cloud.Sequential(L.Conv2d(1, 2, 3), L.BatchNorm2d(2), L.ReLU())
            self.head = L.Dense(8, 3)
            self.note = "not a parameter"

        def forward(self, x):
            return self.head(self.body(x).flatten())

    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == [
        "body.0.weight",
        "body.0.bias",
        "body.1.weight",
        "body.1.bias",
        "head.weight",
        "head.bias",
    ]
    state = net.state_dict()
    assert "body.1.running_mean" in state and "body.1.running_var" in state
    assert net.parameter_count() == 2 * 9 + 2 + 2 + 2 + 24 + 3
    x = RNG.normal(size=(2, 1, 4, 4)).astype(np.float32)
    net.eval()
    # Intermediates are inspectable: a sub-model called on an array runs at once.
    hidden = net.body(x)
    np.testing.assert_allclose(net(x), net.head(hidden.reshape(2, -1)), **TOL)
    other = Net()
    other.load_state_dict(state)
    other.eval()
    np.testing.assert_array_equal(other(x), net(x))


def test_eager_vars_expose_values_and_arithmetic():
    tape = cloud.Tape(eager=True)
    x = tape.input("x", np.arange(4, dtype=np.float32))
    y = (x * 2.0 + 1.0) - x
    np.testing.assert_array_equal(y.numpy(), np.arange(4) + 1.0)
    assert [n.op.name for n in tape.builder.nodes] == ["MUL", "ADD", "SUB"]
    traced = cloud.Tape(eager=False)
    v = traced.input("x", shape=(-1, 4))
    with pytest.raises(TraceError, match="no value while tracing"):
        (v + 1.0).numpy()


def test_traced_graph_matches_eager_forward():
    net = cloud.Sequential(
        L.Rescale(1 / 16),
        L.Conv2d(1, 4, 3, padding=1),
        L.ReLU(),
        L.MaxPool2d(2),
        L.Flatten(),
        L.Dense(64, 10),
    ).eval()
    x = RNG.uniform(0, 16, size=(3, 1, 8, 8)).astype(np.float32)
    model = cloud.trace(net, (1, 8, 8), training=False)
    result = Interpreter(model=model).run({"input": x})["logits"]
    np.testing.assert_allclose(result, net(x), **TOL)
