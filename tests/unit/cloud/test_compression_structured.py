"""Structured channel pruning on the IR: removing channels whose filters are zero keeps the
function exactly, and shapes stay consistent through residual adds, concat, BatchNorm,
depthwise convolution, flatten and the dense head."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet import cloud
from sporenet.cloud import compression as C
from sporenet.cloud import layers as L
from sporenet.cloud.errors import ConfigError
from sporenet.lite import Interpreter, ModelBuilder, OpCode, parse, serialize

RNG = np.random.default_rng(0)


def _conv(
    b: ModelBuilder,
    x: int,
    cin: int,
    cout: int,
    zero: tuple[int, ...] = (),
    *,
    k: int = 3,
    group: int = 1,
    act: str = "none",
) -> int:
    fan_in = cin // group * k * k
    w = (RNG.normal(size=(cout, cin // group, k, k)) * np.sqrt(2 / fan_in)).astype(np.float32)
    bias = RNG.normal(size=cout).astype(np.float32) * 0.1
    w[list(zero)] = 0
    bias[list(zero)] = 0
    return b.op(
        OpCode.CONV2D,
        [x, b.constant("w", w), b.constant("b", bias)],
        pads=[k // 2] * 4,
        strides=[1, 1],
        group=group,
        activation=act,
    )


def residual_concat_net() -> ModelBuilder:
    """x -> A(8, relu) -> B(8, relu) -> Cv(8) ; add(A, Cv) relu -> [add, D(4)] concat
    -> BatchNorm -> depthwise(12) -> E(6) -> GAP -> flatten -> FC(10); a second head
    flattens E's output (6x8x8) into another FC. Channels listed as zero in both A and Cv
    (one residual group), in B, D and E are exactly zero after their activations."""
    b = ModelBuilder()
    x = b.input("x", (-1, 3, 8, 8))
    a = _conv(b, x, 3, 8, (1, 5), act="relu")
    h = _conv(b, a, 8, 8, (0, 3), act="relu")
    c = _conv(b, h, 8, 8, (1, 5))
    s = b.op(OpCode.ADD, [a, c], activation="relu")
    d = _conv(b, s, 8, 4, (2,), act="relu")
    cat = b.op(OpCode.CONCAT, [s, d], axis=1)
    gamma = RNG.uniform(0.5, 1.5, 12).astype(np.float32)
    beta = np.zeros(12, np.float32)  # zero channels stay zero through the BatchNorm
    mean = np.zeros(12, np.float32)
    var = RNG.uniform(0.5, 1.5, 12).astype(np.float32)
    bn = b.op(
        OpCode.BATCH_NORM,
        [
            cat,
            *(b.constant(n, v) for n, v in (("g", gamma), ("be", beta), ("m", mean), ("v", var))),
        ],
    )
    dw = _conv(b, bn, 12, 12, (1, 5, 10), k=3, group=12, act="relu")  # the pruned ones
    e = _conv(b, dw, 12, 6, (0, 4), act="relu")
    pooled = b.op(OpCode.FLATTEN, [b.op(OpCode.GLOBAL_AVG_POOL, [e])])
    w = RNG.normal(size=(10, 6)).astype(np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [pooled, b.constant("fw", w)]), name="y")
    w2 = RNG.normal(size=(3, 6 * 64)).astype(np.float32)
    flat = b.op(OpCode.FLATTEN, [e])
    b.output(b.op(OpCode.FULLY_CONNECTED, [flat, b.constant("fw2", w2)]), name="z")
    return b


def test_pruning_zero_channels_keeps_the_function_exactly():
    model = residual_concat_net().build()
    # 25% of each space: 2 of 8 (A+Cv group, B), 1 of 4 (D), 2 of 6 (E): the zero ones.
    pruned = C.prune_channels(model, 0.25)
    counts = list(C.channel_counts(pruned).values())
    assert counts == [6, 6, 6, 3, 9, 4, 10, 3]  # A, B, Cv, D, depthwise, E, FC, FC2
    x = RNG.normal(size=(4, 3, 8, 8)).astype(np.float32)
    want = Interpreter(model=model).run({"x": x})
    got = Interpreter(model_content=serialize(pruned)).run({"x": x})
    # Equal up to float32 summation order (fewer terms, other conv algorithms).
    for key in ("y", "z"):
        scale = np.abs(want[key]).max()
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5 * scale)
    assert len(serialize(pruned)) < len(serialize(model))
    # The input model is untouched.
    assert list(C.channel_counts(model).values()) == [8, 8, 8, 4, 12, 6, 10, 3]


def test_shapes_stay_consistent_at_any_ratio():
    model = residual_concat_net().build()
    for ratio in (0.1, 0.5, 0.9):
        pruned = parse(serialize(C.prune_channels(model, ratio)))
        out = Interpreter(model=pruned).run({"x": np.ones((2, 3, 8, 8), np.float32)})
        assert out["y"].shape == (2, 10) and out["z"].shape == (2, 3)


def test_fixed_spaces_are_left_alone():
    # A reshape reads the channels in a way the pruner does not follow: its producer keeps
    # all of them; the graph output (FC) keeps its 10 classes.
    b = ModelBuilder()
    x = b.input("x", (-1, 3, 4, 4))
    h = _conv(b, x, 3, 6, act="relu")
    r = b.op(OpCode.RESHAPE, [h], shape=[-1, 96])
    w = RNG.normal(size=(10, 96)).astype(np.float32)
    b.output(b.op(OpCode.FULLY_CONNECTED, [r, b.constant("fw", w)]), name="y")
    model = b.build()
    assert list(C.channel_counts(C.prune_channels(model, 0.5)).values()) == [6, 10]
    with pytest.raises(ConfigError, match="ratio"):
        C.prune_channels(model, 1.0)


def test_cloud_model_with_batch_norm():
    cloud.manual_seed(0)
    net = cloud.Sequential(
        L.Conv2d(1, 8, 3, padding=1, bias=False),
        L.BatchNorm2d(8),
        L.ReLU(),
        L.MaxPool2d(2),
        L.Flatten(),
        L.Dense(8 * 16, 10),
    )
    ir = cloud.to_inference_ir(net, input_shape=(1, 8, 8))
    pruned = C.prune_channels(ir, 0.5)
    assert list(C.channel_counts(pruned).values()) == [4, 10]
    out = Interpreter(model=pruned).run({"input": np.ones((2, 1, 8, 8), np.float32)})
    assert out["logits"].shape == (2, 10)
