"""Depthwise bias forwarding: the bias of a depthwise layer without activation moves into
the 1x1 convolution that reads it, the outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from sporenet.converter.passes import forward_depthwise_biases
from sporenet.lite import ModelBuilder, OpCode
from sporenet.lite.graph import Model
from tests.unit.converter.test_passes import check_rewrite, rand

C, OUT = 8, 6


def block(
    *,
    dw_activation: str = "none",
    pw_pads: list[int] | None = None,
    pw_bias: bool = True,
    second_reader: bool = False,
    half_weights: bool = False,
    stride: int = 1,
) -> Model:
    """x -> depthwise 3x3 (bias) -> 1x1 conv, the BlazeFace / MobileNet block."""
    b = ModelBuilder()
    x = b.input("x", (1, C, 9, 9))
    dw = b.op(
        OpCode.CONV2D,
        [x, b.constant("dw.w", rand(C, 1, 3, 3)), b.constant("dw.b", rand(C))],
        pads=[1, 1, 1, 1],
        group=C,
        activation=dw_activation,
    )
    w2 = b.constant("pw.w", rand(OUT, C, 1, 1).astype(np.float16 if half_weights else np.float32))
    if half_weights:  # float16 weights read through a Cast, as TFLite files store them
        w2 = b.op(OpCode.CAST, [w2], to="float32")
    inputs = [dw, w2] + ([b.constant("pw.b", rand(OUT))] if pw_bias else [])
    attrs = {"strides": [stride, stride]} | ({"pads": pw_pads} if pw_pads else {})
    b.output(b.op(OpCode.CONV2D, inputs, **attrs), name="y")
    if second_reader:
        b.output(b.op(OpCode.RELU, [dw]), name="z")
    return b.build()


def feeds() -> dict[str, np.ndarray]:
    return {"x": rand(1, C, 9, 9)}


@pytest.mark.parametrize("half_weights", [False, True], ids=["float32", "float16-cast"])
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_bias_moves_into_the_pointwise_bias(half_weights, stride):
    model = check_rewrite(
        block(half_weights=half_weights, stride=stride),
        forward_depthwise_biases,
        feeds(),
        rtol=1e-5,
        atol=1e-5,
    )
    dw, pw = (n for n in model.graphs[0].nodes if n.op == OpCode.CONV2D)
    assert len(dw.inputs) == 2 and len(pw.inputs) == 3


@pytest.mark.parametrize(
    "change",
    [
        {"dw_activation": "relu6"},  # the activation sits between the bias and the 1x1
        {"pw_pads": [1, 1, 1, 1]},  # padding reads zeros, not the bias
        {"pw_bias": False},  # the 1x1 layer would gain a bias pass
        {"second_reader": True},  # another reader needs the biased values
    ],
    ids=lambda c: next(iter(c)),
)
def test_blocks_the_bias_cannot_leave_stay(change):
    assert forward_depthwise_biases(block(**change)) == 0
