"""The output gradient of a conv -> ReLU -> max-pool block stored channels-last between
MAX_POOL2D_GRAD (routed, tiling windows) and the convolution's wide-row filter gradient
and input gradient: each kernel gives the NCHW results from channels-last arrays, and a
training run whose plan stores the tensor so trains as the all-NCHW plan does."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.eager import prepare_kernel, run_op
from sporenet.lite.kernels.base import ChannelsLast, TensorSpec
from sporenet.lite.kernels.conv_common import is_channels_last
from sporenet.lite.kernels.training import pool_grad
from sporenet.lite.training import OptimizerConfig, Trainer, make_training_model
from tests.unit.lite.test_filter_bias_gradient import filter_reference

rng = np.random.default_rng(29)


def channels_last(a: np.ndarray) -> np.ndarray:
    """`a` (N, C, H, W) as an NCHW view of channels-last memory."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def bound(op: OpCode, arrays: list[np.ndarray], outputs: list[np.ndarray], **attrs):
    """The kernel of `op` on run-time inputs, bound to the given output arrays and run."""
    specs = [TensorSpec(a.shape, a.dtype) for a in arrays]
    kernel = prepare_kernel(op, attrs, specs, len(outputs), check_outputs=False)
    step = kernel.bind(list(arrays), outputs)
    if step is not None:
        step()
    return kernel


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "pads", "dilations"),
    [
        ((3, 8, 10, 12), (6, 8, 3, 3), [1, 1, 1, 1], [1, 1]),
        ((2, 8, 11, 20), (3, 8, 3, 3), [2, 2, 1, 2], [2, 2]),
    ],
)
def test_wide_row_filter_gradient_reads_channels_last_g(x_shape, w_shape, pads, dilations, bias):
    x = rng.normal(size=x_shape).astype(np.float32)
    attrs = dict(pads=pads, dilations=dilations)
    (y,) = run_op(OpCode.CONV2D, [x, rng.normal(size=w_shape).astype(np.float32)], **attrs)
    g = rng.normal(size=y.shape).astype(np.float32)
    outs = [np.empty(w_shape, np.float32)] + ([np.empty(w_shape[0], np.float32)] if bias else [])
    kernel = bound(
        OpCode.CONV2D_BACKPROP_FILTER,
        [channels_last(g), x, np.zeros(w_shape, np.float32)],
        outs,
        **attrs,
    )
    assert kernel.channels_last_input(0) == ChannelsLast.PREFERRED  # the wide-row path
    dw_ref, db_ref = filter_reference(g, x, w_shape, [1, 1], pads, dilations, 1)
    np.testing.assert_allclose(outs[0], dw_ref, rtol=1e-4, atol=1e-4)
    if bias:
        np.testing.assert_allclose(outs[1], db_ref, rtol=1e-4, atol=1e-4)


def test_other_filter_gradient_paths_refuse_channels_last_g():
    # The planes and per-image paths reshape g in place, which needs NCHW.
    for x_shape, w_shape in [((4, 2, 8, 8), (4, 2, 3, 3)), ((4, 8, 4, 4), (4, 8, 3, 3))]:
        g = TensorSpec((x_shape[0], w_shape[0], *x_shape[2:]), np.dtype(np.float32))
        specs = [g, TensorSpec(x_shape, g.dtype), TensorSpec(w_shape, g.dtype)]
        attrs = {"pads": [1, 1, 1, 1]}
        kernel = prepare_kernel(OpCode.CONV2D_BACKPROP_FILTER, attrs, specs, 1)
        assert kernel.channels_last_input(0) == ChannelsLast.REFUSED


@pytest.mark.parametrize("relu", [0, 1])
def test_routed_pool_gradient_writes_channels_last_dx(relu):
    x = rng.integers(-2, 3, size=(3, 4, 8, 6)).astype(np.float32)  # ties, and y <= 0
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    y, mask = run_op(OpCode.MAX_POOL2D, [x], num_outputs=2, routing=1, **attrs)
    g = rng.normal(size=y.shape).astype(np.float32)
    (ref,) = run_op(OpCode.MAX_POOL2D_GRAD, [g, x, y], relu=relu, **attrs)
    out = channels_last(np.full(x.shape, np.nan, np.float32))
    kernel = bound(OpCode.MAX_POOL2D_GRAD, [g, x, y, mask], [out], relu=relu, **attrs)
    assert kernel.channels_last_output(0) == ChannelsLast.ACCEPTED
    np.testing.assert_array_equal(out, ref)
    # Without a mask, or with windows that overlap, the gradient stays NCHW.
    specs = [TensorSpec(a.shape, a.dtype) for a in (g, x, y)]
    plain = prepare_kernel(OpCode.MAX_POOL2D_GRAD, attrs, specs, 1)
    assert plain.channels_last_output(0) == ChannelsLast.REFUSED


def two_blocks(seed=0):
    """conv(1 -> 8) -> ReLU -> pool -> conv(8 -> 8, wide rows) -> ReLU -> pool -> dense."""
    draw = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (-1, 1, 28, 28))
    h = x
    for k, (c_in, c_out) in enumerate([(1, 8), (8, 8)]):
        w = b.constant(f"c{k}.weight", draw.normal(size=(c_out, c_in, 3, 3)) * 0.4, np.float32)
        bias = b.constant(f"c{k}.bias", draw.normal(size=c_out) * 0.1, np.float32)
        h = b.op(OpCode.RELU, [b.op(OpCode.CONV2D, [h, w, bias], pads=[1, 1, 1, 1])])
        h = b.op(OpCode.MAX_POOL2D, [h], kernel_shape=[2, 2], strides=[2, 2])
    flat = b.op(OpCode.RESHAPE, [h], shape=[-1, 8 * 7 * 7])
    w2 = b.constant("fc.weight", draw.normal(size=(3, 8 * 7 * 7)) * 0.2, np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [flat, w2]), "logits")
    return b.build()


def test_training_with_a_channels_last_pool_gradient_matches_nchw(monkeypatch):
    # Conv c1's output gradient: written by the routed pool gradient, read by the
    # wide-row filter gradient (which prefers it channels-last) and the input gradient.
    x = rng.normal(size=(6, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 3, size=6).astype(np.int64)
    opt = OptimizerConfig("sgd", lr=0.1, momentum=0.9)

    def train():
        model = make_training_model(
            two_blocks(), output="logits", loss="softmax_cross_entropy", optimizer=opt
        )
        trainer = Trainer(model, num_threads=1)
        losses = [trainer.step({"x": x, "labels": labels}) for _ in range(4)]
        plan = next(iter(trainer._train._plans.values()))
        stored = [
            is_channels_last(plan.arrays[n.outputs[0]])
            for n in model.graphs[model.signature("train").graph].nodes
            if n.op == OpCode.MAX_POOL2D_GRAD
        ]
        return losses, trainer.weights(), stored

    losses, weights, stored = train()
    assert stored == [True, False]  # c1's gradient (wide rows); c0's (planes path) NCHW
    monkeypatch.setattr(
        pool_grad.MaxPool2DGrad, "channels_last_output", lambda self, i: ChannelsLast.REFUSED
    )
    nchw_losses, nchw_weights, stored = train()
    assert stored == [False, False]
    np.testing.assert_allclose(losses, nchw_losses, rtol=1e-6)
    for name, value in weights.items():
        np.testing.assert_allclose(value, nchw_weights[name], rtol=1e-5, atol=1e-6)
